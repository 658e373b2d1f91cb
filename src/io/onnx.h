// io/onnx.h — reading ONNX models and tensors (the format every framework exports).
//
// The protobuf schema stays inside onnx.cpp: a model becomes plain Loom structures
// (nodes with typed attributes, named initializers as host tensors, the graph's inputs
// and outputs), so nothing above io/ depends on protobuf. Every failure names the file
// and what was wrong (unreadable, not an ONNX model, a tensor type Loom does not hold,
// a tensor whose data does not match its shape).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

struct OnnxAttribute {
  enum class Kind { none, f, i, s, t, floats, ints, strings };
  Kind kind = Kind::none;
  double f = 0;
  std::int64_t i = 0;
  std::string s;
  Tensor t;  // a host tensor
  std::vector<double> floats;
  std::vector<std::int64_t> ints;
  std::vector<std::string> strings;
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

struct OnnxGraph {
  std::string path, producer;
  std::int64_t ir_version = 0, opset = 0;  // the default domain's opset
  std::vector<OnnxNode> nodes;             // in topological order, as the format requires
  std::vector<std::pair<std::string, Tensor>> initializers;  // host tensors
  std::vector<OnnxValueInfo> inputs;  // graph inputs that are not initializers
  std::vector<OnnxValueInfo> outputs;
};

// Reads an ONNX model file. Tensors (initializers, Constant values) are f32, i64 or i32
// host tensors on `host` (a host-accessible backend); f64 data is narrowed to f32.
OnnxGraph read_onnx(const std::string& path, Backend& host);
// Reads one serialised TensorProto (the test_data_set_*/input_N.pb files of ONNX tests).
Tensor read_onnx_tensor(const std::string& path, Backend& host);

}  // namespace loom::io
