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
  return parse(read_whole_file(path), path);
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, const std::string& path) {
  check(bytes.size() >= 8, path + ": " + std::to_string(bytes.size()) +
                               " bytes; a safetensors file starts with an 8-byte header length");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  check(header_len <= kMaxHeaderBytes && header_len <= bytes.size() - 8,
        path + ": header length = " + std::to_string(header_len) + ", but the file has only " +
            std::to_string(bytes.size() - 8) + " bytes after it (truncated or corrupt)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8,
                                   bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": header is not valid JSON (" + e.what() + ")");
  }
  check(header.is_object(),
        path + ": header is " + std::string(header.type_name()) + ", expected a JSON object");
  SafetensorsFile file;
  file.path_ = path;
  bytes.erase(0, 8 + header_len);  // the data section, without a second copy of it
  file.data_ = std::move(bytes);
  const std::size_t data_size = file.data_.size();
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
  for (const auto& e : file.entries_)
    by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    check(by_offset[i]->begin >= by_offset[i - 1]->end, path + ": tensors '" +
                                                            by_offset[i - 1]->name + "' and '" +
                                                            by_offset[i]->name + "' overlap");
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name)
      return &e;
  return nullptr;
}

Tensor SafetensorsFile::load_f32(const SafetensorsEntry& entry, Backend& backend) const {
  // The entry was checked by read(): n elements of its dtype lie inside the data section.
  const char* src = data_.data() + entry.begin;
  const std::int64_t n = shape_numel(entry.shape);
  std::vector<float> values(static_cast<std::size_t>(n));
  switch (entry.dtype) {
    case DType::f32:
      if (n > 0)  // an empty tensor's vector may hold no storage at all (memcpy of null)
        std::memcpy(values.data(), src, n * sizeof(float));
      break;
    case DType::bf16:
    case DType::f16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        values[i] = entry.dtype == DType::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
      }
      break;
    default:
      throw Error(path_ + ": tensor '" + entry.name + "' is " +
                  std::string(safetensors_name(entry.dtype)) + ", expected a floating-point dtype");
  }
  return Tensor::from_floats(entry.shape, values, backend);
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
