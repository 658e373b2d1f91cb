#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"
#include "io/atomic_file.h"

namespace loom::io {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own limit

}  // namespace

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  return open(std::make_shared<const ReadOnlyFile>(path));
}

SafetensorsFile SafetensorsFile::open(std::shared_ptr<const ReadOnlyFile> source) {
  SafetensorsFile file;
  file.path_ = source->path();
  const std::uint64_t size = source->size();
  check(size >= 8, file.path_ + ": " + std::to_string(size) +
                       " bytes; a safetensors file starts with an 8-byte header length");
  unsigned char first8[8] = {};
  source->read(0, 8, first8);
  std::uint64_t header_len = 0;  // little-endian
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | first8[i];
  check(header_len <= kMaxHeaderBytes && header_len <= size - 8,
        file.path_ + ": header length = " + std::to_string(header_len) +
            ", but the file has only " + std::to_string(size - 8) +
            " bytes after it (truncated or corrupt)");
  std::string json(header_len, '\0');
  source->read(8, header_len, json.data());
  file.data_start_ = 8 + header_len;
  file.parse_header(json, size - file.data_start_);
  file.source_ = std::move(source);
  return file;
}

void SafetensorsFile::parse_header(std::string_view json, std::uint64_t data_size) {
  const std::string& path = path_;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": header is not valid JSON (" + e.what() + ")");
  }
  check(header.is_object(),
        path + ": header is " + std::string(header.type_name()) + ", expected a JSON object");
  SafetensorsFile& file = *this;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      check(value.is_object(), path + ": __metadata__ must be an object of strings");
      for (auto& [k, v] : value.items()) {
        check(v.is_string(), path + ": __metadata__." + k + " is " + std::string(v.type_name()) +
                                 ", expected a string");
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    std::string where = path + ": tensor '" + name + "'";
    check(value.is_object() && value.contains("dtype") && value.contains("shape") &&
              value.contains("data_offsets"),
          where + " needs dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.name = name;
    check(
        value["dtype"].is_string() &&
            parse_safetensors_dtype(value["dtype"].get<std::string>(), e.dtype),
        where + ": dtype " + value["dtype"].dump() + " is not one of F32, BF16, F16, I32, I64, U8");
    check(value["shape"].is_array(),
          where + ": shape " + value["shape"].dump() + " is not an array");
    for (const auto& d : value["shape"]) {
      check(d.is_number_unsigned(),
            where + ": shape " + value["shape"].dump() + " must hold non-negative integers");
      // Read unsigned: as int64, 2^63 would become -2^63.
      check(d.get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxFileElements),
            where + ": shape " + value["shape"].dump() +
                " has a dimension above 2^48, the most Loom reads");
      e.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
    }
    const std::int64_t count = checked_numel(e.shape, where);
    const auto& offsets = value["data_offsets"];
    check(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
              offsets[1].is_number_unsigned(),
          where + ": data_offsets " + offsets.dump() + " must be [begin, end]");
    e.begin = offsets[0].get<std::size_t>();
    e.end = offsets[1].get<std::size_t>();
    check(e.begin <= e.end && e.end <= data_size, where + ": data_offsets " + offsets.dump() +
                                                      " outside the data section of " +
                                                      std::to_string(data_size) + " bytes");
    // count <= 2^48 and a dtype of at most 8 bytes: the product cannot wrap.
    const std::size_t expected = static_cast<std::size_t>(count) * dtype_size(e.dtype);
    check(e.end - e.begin == expected,
          where + ": data_offsets " + offsets.dump() + " span " + std::to_string(e.end - e.begin) +
              " bytes, but " + std::string(safetensors_name(e.dtype)) + shape_str(e.shape) +
              " needs " + std::to_string(expected));
    file.entries_.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_)
    by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    check(by_offset[i]->begin >= by_offset[i - 1]->end, path + ": tensors '" +
                                                            by_offset[i - 1]->name + "' and '" +
                                                            by_offset[i]->name + "' overlap");
}

void SafetensorsFile::read_data(const SafetensorsEntry& entry, void* out) const {
  // The entry was checked against the data section's size: its bytes lie inside it.
  const std::size_t n = entry.end - entry.begin;
  if (n == 0)  // an empty tensor's buffer may be null (memcpy of null)
    return;
  source_->read(data_start_ + entry.begin, n, out);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name)
      return &e;
  return nullptr;
}

std::vector<float> SafetensorsFile::floats(const SafetensorsEntry& entry) const {
  const std::int64_t n = shape_numel(entry.shape);
  std::vector<float> values(static_cast<std::size_t>(n));
  std::string half;  // bf16 and f16: the raw bits
  switch (entry.dtype) {
    case DType::f32:
      read_data(entry, values.data());
      break;
    case DType::bf16:
    case DType::f16:
      half.resize(entry.end - entry.begin);
      read_data(entry, half.data());
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, half.data() + 2 * i, 2);
        values[i] = entry.dtype == DType::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
      }
      break;
    default:
      throw Error(path_ + ": tensor '" + entry.name + "' is " +
                  std::string(safetensors_name(entry.dtype)) + ", expected a floating-point dtype");
  }
  return values;
}

Tensor SafetensorsFile::load_f32(const SafetensorsEntry& entry, Backend& backend) const {
  return Tensor::from_floats(entry.shape, floats(entry), backend);
}

std::string safetensors_bytes(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  std::size_t offset = 0;
  std::vector<std::vector<float>> f32_data;
  for (const auto& [name, tensor] : tensors) {
    check(tensor.dtype() == DType::f32,
          path + ": tensor '" + name + "' is " + tensor.describe() + "; Loom writes f32");
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + tensor.nbytes()}}};
    offset += tensor.nbytes();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out;
  out.reserve(8 + json.size() + offset);
  std::uint64_t len = json.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += json;
  for (const auto& [name, tensor] : tensors) {
    if (tensor.backend().host_accessible() && tensor.is_contiguous()) {  // no staging copy
      out.append(reinterpret_cast<const char*>(tensor.data<float>()), tensor.nbytes());
      continue;
    }
    std::vector<float> values = tensor.to_floats();
    out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, safetensors_bytes(path, tensors, metadata));
}

}  // namespace loom::io
