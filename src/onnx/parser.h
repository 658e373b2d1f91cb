// onnx/parser.h — reading ONNX models and tensors (the format every framework exports).
//
// The protobuf schema stays inside parser.cpp: a model becomes plain Loom structures
// (nodes with typed attributes, named initializers as host tensors, the graph's inputs
// and outputs), so nothing above io/ depends on protobuf. Every failure names the file
// and what was wrong (unreadable, not an ONNX model, a tensor type Loom does not hold,
// a tensor whose data does not match its shape).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

// ONNX TensorProto element types, by number: Debian's compiled schema predates the 8-, 4-
// and 2-bit ones (onnx 1.14 to 1.20), and Cast names its target this way.
namespace onnx_type {
enum : std::int64_t {
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUint32 = 12,
  kUint64 = 13,
  kBfloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUint4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,
  kFloat8E8M0 = 24,
  kUint2 = 25,
  kInt2 = 26
};
}  // namespace onnx_type

struct OnnxGraph;

struct OnnxAttribute {
  enum class Kind { none, f, i, s, t, floats, ints, strings, graph };
  Kind kind = Kind::none;
  double f = 0;
  std::int64_t i = 0;
  std::string s;
  Tensor t;  // a host tensor
  std::vector<double> floats;
  std::vector<std::int64_t> ints;
  std::vector<std::string> strings;
  std::shared_ptr<const OnnxGraph> graph;  // a subgraph: If's branches, Loop's and Scan's body
};

struct OnnxNode {
  std::string op_type, name, domain;
  std::vector<std::string> inputs, outputs;  // "" marks an omitted optional input
  std::map<std::string, OnnxAttribute> attributes;
};

struct OnnxValueInfo {
  std::string name;
  std::vector<std::int64_t> shape;  // -1 where the dimension is symbolic or unknown
  DType dtype = DType::f32;
  int onnx_type = 0;  // the declared TensorProto element type (0: not a tensor)
};

// A model's main graph, or a subgraph of a node (its `path` then names the node and the
// attribute, so errors inside it say where it is).
struct OnnxGraph {
  std::string path, producer;
  std::string file;                        // the model file (external data is found beside it)
  std::int64_t ir_version = 0, opset = 0;  // the default domain's opset
  std::int64_t upgraded_from = 0;  // the opset the file declared, when it was upgraded (else 0)
  std::vector<OnnxNode> nodes;     // in topological order, as the format requires
  std::vector<std::pair<std::string, Tensor>> initializers;  // host tensors
  // The TensorProto element types the file uses (initializers, Constant values, declared
  // inputs, outputs and intermediate values, Cast targets), its subgraphs' included.
  std::set<int> element_types;
  std::vector<OnnxValueInfo> inputs;  // graph inputs that are not initializers
  std::vector<OnnxValueInfo> outputs;
};

// The oldest default-domain opset the importer reads as written; older models are
// upgraded to it with ONNX's version converter on reading.
inline constexpr std::int64_t kOldestReadOpset = 7;

// An ONNX element type's name ("FLOAT16"), and how Loom holds and computes its values
// ("f32, widened: computed in f32; a Cast to it rounds").
std::string onnx_type_name(int type);
std::string onnx_type_held_as(int type);
// g's element types, each with how it is held: "FLOAT (f32), INT64 (i64 on the host)".
std::string describe_element_types(const OnnxGraph& g);

// Reads an ONNX model file. Tensors (initializers, Constant values) are f32, i64 or i32
// host tensors on `host` (a host-accessible backend); f64 data is narrowed to f32.
OnnxGraph read_onnx(const std::string& path, Backend& host);
// Reads one serialised TensorProto (the test_data_set_*/input_N.pb files of ONNX tests).
Tensor read_onnx_tensor(const std::string& path, Backend& host);

}  // namespace loom::io
