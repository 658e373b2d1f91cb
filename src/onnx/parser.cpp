#include "onnx/parser.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"
#include "io/atomic_file.h"

namespace loom::io {
namespace {

std::string data_type_name(int type) {
  return onnx::TensorProto_DataType_IsValid(type)
             ? onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(type))
             : std::to_string(type);
}

// Copies `count` values, either from the typed repeated field or from raw_data (little
// endian, as the format specifies), converting each with `convert`. The data's size is
// checked against the shape before anything is allocated: a file can declare a shape of
// terabytes over a few bytes of data.
template <class Out, class Raw, class Field, class Convert>
std::vector<Out> values_of(const onnx::TensorProto& t, const Shape& shape, std::int64_t count,
                           const Field& field, Convert convert, const std::string& where) {
  if (!t.raw_data().empty()) {
    const std::size_t bytes = t.raw_data().size();
    check(bytes % sizeof(Raw) == 0 && bytes / sizeof(Raw) == static_cast<std::uint64_t>(count),
          where + ": raw_data holds " + std::to_string(bytes) + " bytes, the shape " +
              shape_str(shape) + " needs " + std::to_string(count) + " values of " +
              std::to_string(sizeof(Raw)) + " bytes");
    std::vector<Out> out(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      Raw v;
      std::memcpy(&v, t.raw_data().data() + i * static_cast<std::int64_t>(sizeof(Raw)),
                  sizeof(Raw));
      out[static_cast<std::size_t>(i)] = convert(v);
    }
    return out;
  }
  check(field.size() == count, where + ": holds " + std::to_string(field.size()) +
                                   " values, the shape " + shape_str(shape) + " needs " +
                                   std::to_string(count));
  std::vector<Out> out(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    out[static_cast<std::size_t>(i)] = convert(field.Get(static_cast<int>(i)));
  return out;
}

using namespace onnx_type;  // kFloat8E4M3FN, kInt4, ...

// The bytes of a tensor whose values are `bits` wide (8, 4 or 2), packed low bits first:
// from raw_data, or one byte per int32_data entry. Checked against the shape.
std::vector<std::uint8_t> packed_bytes(const onnx::TensorProto& t, const Shape& shape,
                                       std::int64_t count, int bits, const std::string& where) {
  const auto needed = static_cast<std::size_t>((count * bits + 7) / 8);
  std::vector<std::uint8_t> bytes;
  if (!t.raw_data().empty()) {
    bytes.assign(t.raw_data().begin(), t.raw_data().end());
  } else {
    for (int i = 0; i < t.int32_data_size(); ++i)
      bytes.push_back(static_cast<std::uint8_t>(t.int32_data(i)));
  }
  check(bytes.size() == needed, where + ": holds " + std::to_string(bytes.size()) +
                                    " bytes, the shape " + shape_str(shape) + " needs " +
                                    std::to_string(needed) + " (" + std::to_string(bits) +
                                    "-bit values)");
  return bytes;
}

// Value k of `bytes` packed `bits` wide, low bits first; sign-extended when `is_signed`.
std::int64_t unpack(const std::vector<std::uint8_t>& bytes, std::int64_t k, int bits,
                    bool is_signed) {
  const std::int64_t bit = k * bits;
  const int v = (bytes[static_cast<std::size_t>(bit / 8)] >> (bit % 8)) & ((1 << bits) - 1);
  return is_signed && (v >> (bits - 1)) ? v - (1 << bits) : v;
}

// The narrow float formats (FP8, FP4) as f32, and INT4/UINT4/INT2/UINT2 as i64.
Tensor narrow_tensor(const onnx::TensorProto& t, const Shape& shape, std::int64_t count,
                     Backend& host, const std::string& where) {
  const int type = t.data_type();
  const int bits = type == kFloat4E2M1 || type == kInt4 || type == kUint4 ? 4
                   : type == kInt2 || type == kUint2                      ? 2
                                                                          : 8;
  const std::vector<std::uint8_t> bytes = packed_bytes(t, shape, count, bits, where);
  if (type == kInt4 || type == kUint4 || type == kInt2 || type == kUint2) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(count));
    for (std::int64_t k = 0; k < count; ++k)
      v[static_cast<std::size_t>(k)] = unpack(bytes, k, bits, type == kInt4 || type == kInt2);
    return Tensor::from_host(shape, DType::i64, v.data(), host);
  }
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) {
    const auto b = static_cast<std::uint8_t>(unpack(bytes, k, bits, false));
    float& out = v[static_cast<std::size_t>(k)];
    switch (type) {
      case kFloat8E4M3FN:
        out = narrow_float_decode(b, NarrowFloat::e4m3fn);
        break;
      case kFloat8E4M3FNUZ:
        out = narrow_float_decode(b, NarrowFloat::e4m3fnuz);
        break;
      case kFloat8E5M2:
        out = narrow_float_decode(b, NarrowFloat::e5m2);
        break;
      case kFloat8E5M2FNUZ:
        out = narrow_float_decode(b, NarrowFloat::e5m2fnuz);
        break;
      case kFloat4E2M1:
        out = narrow_float_decode(b, NarrowFloat::e2m1fn);
        break;
      default:  // FLOAT8E8M0: a power of two, 2^(b - 127); 0xFF is NaN
        out = b == 0xFF ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, b - 127);
    }
  }
  return Tensor::from_host(shape, DType::f32, v.data(), host);
}

// A tensor stored outside the model (models over protobuf's 2 GB, saved with
// save_as_external_data): its bytes from `location` (relative to the model's folder, never
// leaving it), `offset` and `length`, as raw data.
onnx::TensorProto with_external_data(const onnx::TensorProto& t, const std::string& folder,
                                     const std::string& where) {
  std::string location;
  std::int64_t offset = 0, length = -1;
  for (const auto& entry : t.external_data()) {
    auto number = [&](const std::string& v) {
      std::int64_t x = -1;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      check(ec == std::errc() && end == v.data() + v.size() && x >= 0,
            where + ": external_data '" + entry.key() + "' is '" + v +
                "', expected a non-negative integer");
      return x;
    };
    if (entry.key() == "location")
      location = entry.value();
    else if (entry.key() == "offset")
      offset = number(entry.value());
    else if (entry.key() == "length")
      length = number(entry.value());
  }
  check(!location.empty(), where + ": external data without a 'location'");
  const std::filesystem::path relative(location);
  bool inside = relative.is_relative();
  for (const auto& part : relative)
    inside = inside && part != "..";
  check(inside, where + ": external data location '" + location +
                    "' must be a path inside the model's folder (relative, without '..')");
  const std::string file = (std::filesystem::path(folder) / relative).string();
  std::error_code ec;
  // Through a symbolic link too, the data must stay inside the model's folder.
  const auto real = std::filesystem::weakly_canonical(file, ec).string();
  const auto base = std::filesystem::weakly_canonical(folder, ec).string();
  check(!ec && real.rfind(base + "/", 0) == 0 && std::filesystem::is_regular_file(real, ec),
        where + ": external data file " + file + " is not a file inside the model's folder");
  const auto size = std::filesystem::file_size(file, ec);
  check(!ec, where + ": external data file " + file + " cannot be read (" + ec.message() + ")");
  const auto file_size = static_cast<std::int64_t>(size);
  if (length < 0)
    length = file_size - std::min(offset, file_size);
  check(checked_add(offset, length, where + " external data") <= file_size,
        where + ": external data at offset " + std::to_string(offset) + ", length " +
            std::to_string(length) + " runs past the end of " + file + " (" +
            std::to_string(file_size) + " bytes)");
  std::ifstream in(file, std::ios::binary);
  check(in.good(), where + ": external data file " + file + " cannot be opened");
  std::string bytes(static_cast<std::size_t>(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  check(in.good() || (length == 0 && !in.bad()), where + ": reading " + file + " failed");
  onnx::TensorProto inlined = t;
  inlined.clear_external_data();
  inlined.set_data_location(onnx::TensorProto_DataLocation_DEFAULT);
  inlined.set_raw_data(std::move(bytes));
  return inlined;
}

Tensor to_tensor(const onnx::TensorProto& t, Backend& host, const std::string& where) {
  check(t.data_location() != onnx::TensorProto_DataLocation_EXTERNAL,
        where +
            ": tensor data in an external file, which only a model's initializers may "
            "have");
  const Shape shape(t.dims().begin(), t.dims().end());
  const std::int64_t count = checked_numel(shape, where);
  switch (t.data_type()) {
    case onnx::TensorProto_DataType_FLOAT: {
      auto v = values_of<float, float>(
          t, shape, count, t.float_data(), [](float x) { return x; }, where);
      return Tensor::from_host(shape, DType::f32, v.data(), host);
    }
    case onnx::TensorProto_DataType_DOUBLE: {
      auto v = values_of<float, double>(
          t, shape, count, t.double_data(), [](double x) { return static_cast<float>(x); }, where);
      return Tensor::from_host(shape, DType::f32, v.data(), host);
    }
    case onnx::TensorProto_DataType_INT64: {
      auto v = values_of<std::int64_t, std::int64_t>(
          t, shape, count, t.int64_data(), [](std::int64_t x) { return x; }, where);
      return Tensor::from_host(shape, DType::i64, v.data(), host);
    }
    case onnx::TensorProto_DataType_INT32: {
      auto v = values_of<std::int32_t, std::int32_t>(
          t, shape, count, t.int32_data(), [](std::int32_t x) { return x; }, where);
      return Tensor::from_host(shape, DType::i32, v.data(), host);
    }
    case onnx::TensorProto_DataType_BOOL:
    case onnx::TensorProto_DataType_UINT8: {
      auto v = values_of<std::uint8_t, std::uint8_t>(
          t, shape, count, t.int32_data(), [](auto x) { return static_cast<std::uint8_t>(x); },
          where);
      return Tensor::from_host(shape, DType::u8, v.data(), host);
    }
    // Narrower integers are held as i64 on the host, where Loom keeps integer values.
    case onnx::TensorProto_DataType_INT8: {
      auto v = values_of<std::int64_t, std::int8_t>(
          t, shape, count, t.int32_data(),
          [](auto x) { return static_cast<std::int64_t>(static_cast<std::int8_t>(x)); }, where);
      return Tensor::from_host(shape, DType::i64, v.data(), host);
    }
    case onnx::TensorProto_DataType_INT16: {
      auto v = values_of<std::int64_t, std::int16_t>(
          t, shape, count, t.int32_data(),
          [](auto x) { return static_cast<std::int64_t>(static_cast<std::int16_t>(x)); }, where);
      return Tensor::from_host(shape, DType::i64, v.data(), host);
    }
    case onnx::TensorProto_DataType_UINT16: {
      auto v = values_of<std::int64_t, std::uint16_t>(
          t, shape, count, t.int32_data(),
          [](auto x) { return static_cast<std::int64_t>(static_cast<std::uint16_t>(x)); }, where);
      return Tensor::from_host(shape, DType::i64, v.data(), host);
    }
    case onnx::TensorProto_DataType_UINT32: {
      auto v = values_of<std::int64_t, std::uint32_t>(
          t, shape, count, t.uint64_data(),
          [](auto x) { return static_cast<std::int64_t>(static_cast<std::uint32_t>(x)); }, where);
      return Tensor::from_host(shape, DType::i64, v.data(), host);
    }
    case onnx::TensorProto_DataType_UINT64: {
      auto v = values_of<std::uint64_t, std::uint64_t>(
          t, shape, count, t.uint64_data(), [](std::uint64_t x) { return x; }, where);
      std::vector<std::int64_t> wide(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        check(v[i] <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
              where + ": UINT64 value " + std::to_string(v[i]) +
                  " is above 2^63 - 1, the largest integer Loom holds");
        wide[i] = static_cast<std::int64_t>(v[i]);
      }
      return Tensor::from_host(shape, DType::i64, wide.data(), host);
    }
    // Half-precision floats are computed in f32 (the bits sit in int32_data or raw_data).
    case onnx::TensorProto_DataType_FLOAT16: {
      auto v = values_of<float, std::uint16_t>(
          t, shape, count, t.int32_data(),
          [](auto x) { return f16_to_float(static_cast<std::uint16_t>(x)); }, where);
      return Tensor::from_host(shape, DType::f32, v.data(), host);
    }
    case onnx::TensorProto_DataType_BFLOAT16: {
      auto v = values_of<float, std::uint16_t>(
          t, shape, count, t.int32_data(),
          [](auto x) { return bf16_to_float(static_cast<std::uint16_t>(x)); }, where);
      return Tensor::from_host(shape, DType::f32, v.data(), host);
    }
    case kFloat8E4M3FN:
    case kFloat8E4M3FNUZ:
    case kFloat8E5M2:
    case kFloat8E5M2FNUZ:
    case kFloat8E8M0:
    case kFloat4E2M1:
    case kInt4:
    case kUint4:
    case kInt2:
    case kUint2:
      return narrow_tensor(t, shape, count, host, where);
    default:
      throw Error(where + ": element type " + data_type_name(t.data_type()) +
                  " is not supported (expected FLOAT, FLOAT16, BFLOAT16, DOUBLE, FLOAT8*, "
                  "FLOAT4E2M1, an integer type of 2 to 64 bits, or BOOL)");
  }
}

DType dtype_of(int elem_type) {
  switch (elem_type) {
    case onnx::TensorProto_DataType_INT64:
      return DType::i64;
    case onnx::TensorProto_DataType_INT32:
      return DType::i32;
    case onnx::TensorProto_DataType_INT8:
    case onnx::TensorProto_DataType_INT16:
    case onnx::TensorProto_DataType_UINT16:
    case onnx::TensorProto_DataType_UINT32:
    case onnx::TensorProto_DataType_UINT64:
    case kInt4:
    case kUint4:
    case kInt2:
    case kUint2:
      return DType::i64;
    case onnx::TensorProto_DataType_BOOL:
    case onnx::TensorProto_DataType_UINT8:
      return DType::u8;
    default:
      return DType::f32;
  }
}

OnnxValueInfo value_info(const onnx::ValueInfoProto& v) {
  OnnxValueInfo info;
  info.name = v.name();
  if (v.type().has_tensor_type()) {
    info.dtype = dtype_of(v.type().tensor_type().elem_type());
    info.onnx_type = v.type().tensor_type().elem_type();
    for (const auto& d : v.type().tensor_type().shape().dim())
      info.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
  }
  return info;
}

void read_graph(const onnx::GraphProto& graph, Backend& host, OnnxGraph& g, int depth);

OnnxAttribute attribute(const onnx::AttributeProto& a, Backend& host, const std::string& where,
                        int depth, const OnnxGraph& parent) {
  OnnxAttribute out;
  using A = onnx::AttributeProto;
  switch (a.type()) {
    case A::FLOAT:
      out.kind = OnnxAttribute::Kind::f, out.f = a.f();
      break;
    case A::INT:
      out.kind = OnnxAttribute::Kind::i, out.i = a.i();
      break;
    case A::STRING:
      out.kind = OnnxAttribute::Kind::s, out.s = a.s();
      break;
    case A::TENSOR:
      out.kind = OnnxAttribute::Kind::t;
      out.t = to_tensor(a.t(), host, where + " attribute '" + a.name() + "'");
      break;
    case A::FLOATS:
      out.kind = OnnxAttribute::Kind::floats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case A::INTS:
      out.kind = OnnxAttribute::Kind::ints;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case A::STRINGS:
      out.kind = OnnxAttribute::Kind::strings;
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case A::GRAPH: {
      // Subgraphs nest (a Loop in an If branch); a hostile file could nest them deeper
      // than any model does, so the depth is bounded.
      check(depth < 32, where + " attribute '" + a.name() + "': subgraphs nest more than 32 deep");
      auto sub = std::make_shared<OnnxGraph>();
      sub->path = where + " attribute '" + a.name() + "'";
      sub->producer = parent.producer;
      sub->file = parent.file;
      sub->ir_version = parent.ir_version;
      sub->opset = parent.opset;
      read_graph(a.g(), host, *sub, depth + 1);
      out.kind = OnnxAttribute::Kind::graph;
      out.graph = std::move(sub);
      break;
    }
    default:
      // Lists of graphs and sparse tensors: kept as "none"; the op that reads them says so.
      break;
  }
  return out;
}

// The graph's initializers, inputs (those not initialized), outputs and nodes into g, whose
// path names the file (or, for a subgraph, the node and attribute holding it).
void read_graph(const onnx::GraphProto& graph, Backend& host, OnnxGraph& g, int depth) {
  const std::string& path = g.path;
  std::set<std::string> initialized;
  for (const auto& v : graph.input())
    g.element_types.insert(v.type().tensor_type().elem_type());
  for (const auto& v : graph.output())
    g.element_types.insert(v.type().tensor_type().elem_type());
  for (const auto& v : graph.value_info())
    g.element_types.insert(v.type().tensor_type().elem_type());
  for (const onnx::TensorProto& t : graph.initializer()) {
    g.element_types.insert(t.data_type());
    const std::string where = path + ": initializer '" + t.name() + "'";
    const std::string folder = std::filesystem::path(g.file).parent_path().string();
    g.initializers.emplace_back(
        t.name(),
        t.data_location() == onnx::TensorProto_DataLocation_EXTERNAL
            ? to_tensor(with_external_data(t, folder.empty() ? "." : folder, where), host, where)
            : to_tensor(t, host, where));
    initialized.insert(t.name());
  }
  for (const auto& v : graph.input())
    if (!initialized.count(v.name()))
      g.inputs.push_back(value_info(v));
  for (const auto& v : graph.output())
    g.outputs.push_back(value_info(v));
  for (const onnx::NodeProto& n : graph.node()) {
    OnnxNode node;
    node.op_type = n.op_type();
    node.name = n.name();
    node.domain = n.domain();
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    const std::string where = path + ": node '" + n.name() + "' (" + n.op_type() + ")";
    for (const auto& a : n.attribute()) {
      if (a.type() == onnx::AttributeProto::TENSOR)
        g.element_types.insert(a.t().data_type());
      if ((n.op_type() == "Cast" || n.op_type() == "ConstantOfShape") && a.name() == "to" &&
          a.type() == onnx::AttributeProto::INT)
        g.element_types.insert(static_cast<int>(a.i()));
      OnnxAttribute& read = node.attributes[a.name()] = attribute(a, host, where, depth, g);
      if (read.graph != nullptr)
        g.element_types.insert(read.graph->element_types.begin(), read.graph->element_types.end());
    }
    g.nodes.push_back(std::move(node));
  }
  g.element_types.erase(0);  // values declared without a tensor type
}

}  // namespace

std::string onnx_type_name(int type) {
  static const char* const names[] = {
      "UNDEFINED",      "FLOAT",    "UINT8",        "INT8",           "UINT16",
      "INT16",          "INT32",    "INT64",        "STRING",         "BOOL",
      "FLOAT16",        "DOUBLE",   "UINT32",       "UINT64",         "COMPLEX64",
      "COMPLEX128",     "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
      "FLOAT8E5M2FNUZ", "UINT4",    "INT4",         "FLOAT4E2M1",     "FLOAT8E8M0",
      "UINT2",          "INT2"};
  if (type >= 0 && type < static_cast<int>(std::size(names)))
    return names[type];
  return "type " + std::to_string(type);
}

std::string onnx_type_held_as(int type) {
  switch (type) {
    case kFloat:
      return "f32";
    case kDouble:
      return "f32, narrowed: computed in single precision";
    case kFloat16:
    case kBfloat16:
    case kFloat8E4M3FN:
    case kFloat8E4M3FNUZ:
    case kFloat8E5M2:
    case kFloat8E5M2FNUZ:
    case kFloat4E2M1:
    case kFloat8E8M0:
      return "f32, widened: computed in f32, a Cast to it rounds";
    case kInt32:
      return "i32 on the host";
    case kBool:
    case kUint8:
      return "u8 on the host";
    case kInt64:
    case kInt8:
    case kInt16:
    case kUint16:
    case kUint32:
    case kUint64:
    case kInt4:
    case kUint4:
    case kInt2:
    case kUint2:
      return "i64 on the host";
    case 0:
      return "not a tensor";
    default:
      return "not supported";
  }
}

std::string describe_element_types(const OnnxGraph& g) {
  std::string text;
  for (int type : g.element_types)
    text +=
        (text.empty() ? "" : ", ") + onnx_type_name(type) + " (" + onnx_type_held_as(type) + ")";
  return text.empty() ? "none declared" : text;
}

namespace {

// Every value a node reads (or the graph returns) is a graph input, an initializer or an
// earlier node's output: ONNX's version converter dereferences each name's definition
// without checking it.
void check_defined_before_use(const onnx::GraphProto& graph, const std::string& path) {
  std::set<std::string> defined;
  for (const auto& v : graph.input())
    defined.insert(v.name());
  for (const auto& t : graph.initializer())
    defined.insert(t.name());
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    for (const std::string& in : node.input())
      check(in.empty() || defined.count(in) == 1, [&] {
        return path + ": node " + std::to_string(i) + " (" + node.op_type() + ") reads '" + in +
               "', which no input, initializer or earlier node defines";
      });
    for (const std::string& out : node.output())
      defined.insert(out);
  }
  for (const auto& v : graph.output())
    check(defined.count(v.name()) == 1,
          [&] { return path + ": graph output '" + v.name() + "' is not a value of the graph"; });
}

}  // namespace

OnnxGraph read_onnx(const std::string& path, Backend& host) {
  onnx::ModelProto model;
  check(model.ParseFromString(read_whole_file(path)),
        path + ": not an ONNX model (the protobuf ModelProto does not parse)");
  check(model.has_graph(), path + ": the model has no graph");
  // Models written for opsets before 7 (attribute-driven broadcasting, Reshape's shape
  // attribute, ...) are first upgraded to opset 7 with ONNX's own version converter, so
  // the importer reads one set of op definitions from opset 7 on.
  std::int64_t declared = 0;
  for (const auto& opset : model.opset_import())
    if (opset.domain().empty() || opset.domain() == "ai.onnx")
      declared = opset.version();
  if (declared > 0 && declared < kOldestReadOpset) {
    try {
      // The converter trusts its input: a graph that names values no node or input defines
      // crashes it (a null dereference inside onnx's graphProtoToGraph, found by fuzzing).
      check_defined_before_use(model.graph(), path);
      // The converter's adapters (broadcasting ones) need the values' shapes.
      onnx::shape_inference::InferShapes(model);
      model = onnx::version_conversion::ConvertVersion(model, kOldestReadOpset);
      // Debian's converter (onnx 1.12) writes the shape constant of Reshape_4_5 without
      // its dims: a rank-0 tensor holding n > 1 values, which is the 1-D [n] it meant.
      for (onnx::NodeProto& node : *model.mutable_graph()->mutable_node())
        for (onnx::AttributeProto& a : *node.mutable_attribute())
          if (node.op_type() == "Constant" && a.has_t() && a.t().dims_size() == 0 &&
              a.t().int64_data_size() > 1)
            a.mutable_t()->add_dims(a.t().int64_data_size());
    } catch (const std::exception& e) {
      throw Error(path + ": written for opset " + std::to_string(declared) +
                  ", which ONNX's version converter cannot upgrade to opset " +
                  std::to_string(kOldestReadOpset) + ": " + e.what());
    }
  }
  OnnxGraph g;
  g.path = path;
  g.file = path;
  g.upgraded_from = declared > 0 && declared < kOldestReadOpset ? declared : 0;
  g.producer = model.producer_name() +
               (model.producer_version().empty() ? "" : " " + model.producer_version());
  g.ir_version = model.ir_version();
  for (const auto& opset : model.opset_import())
    if (opset.domain().empty() || opset.domain() == "ai.onnx")
      g.opset = opset.version();
  read_graph(model.graph(), host, g, 0);
  return g;
}

Tensor read_onnx_tensor(const std::string& path, Backend& host) {
  onnx::TensorProto t;
  check(t.ParseFromString(read_whole_file(path)),
        path + ": not an ONNX TensorProto (the protobuf does not parse)");
  return to_tensor(t, host, path);
}

}  // namespace loom::io
