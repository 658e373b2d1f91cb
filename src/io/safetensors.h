// io/safetensors.h — the safetensors format: an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the raw little-endian data. Reading validates everything the header claims
// against the file; writing is atomic.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  std::size_t begin = 0, end = 0;  // byte range within the data section
};

class SafetensorsFile {
 public:
  // Reads and validates `path`; throws naming the file, the tensor or field, the value
  // and what was expected (truncated files, lying offsets, overlaps, bad JSON, ...).
  static SafetensorsFile read(const std::string& path);
  // The same from the file's bytes, read already (`path` names it in errors).
  static SafetensorsFile parse(std::string bytes, const std::string& path);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // A new tensor on `backend` holding the entry's data (f32/bf16/f16 entries convert to f32).
  Tensor load_f32(const SafetensorsEntry& entry, Backend& backend) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::string data_;  // the data section
};

// The bytes of a safetensors file of `tensors` (any device; copied to the host) and string
// metadata (`path` names the file in errors).
std::string safetensors_bytes(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata);
// Writes them atomically.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace loom::io
