// io/safetensors.h — the safetensors format: an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the raw little-endian data. Reading validates everything the header claims
// against the file; writing is atomic.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/read_only_file.h"

namespace loom::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  std::size_t begin = 0, end = 0;  // byte range within the data section
};

class SafetensorsFile {
 public:
  // Reads and validates `path`'s header against the file; throws naming the file, the tensor
  // or field, the value and what was expected (truncated files, lying offsets, overlaps, bad
  // JSON, ...). The data is read when a tensor is loaded, from the file as it was opened, so
  // a reader holds one tensor at a time, not the file.
  static SafetensorsFile read(const std::string& path);
  // The same from a file opened already.
  static SafetensorsFile open(std::shared_ptr<const ReadOnlyFile> file);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // A new tensor on `backend` holding the entry's data (f32/bf16/f16 entries convert to f32).
  Tensor load_f32(const SafetensorsEntry& entry, Backend& backend) const;
  // The entry's values as floats (the same conversions), in row-major order.
  std::vector<float> floats(const SafetensorsEntry& entry) const;
  const std::string& path() const { return path_; }

 private:
  // The header's JSON, before a data section of `data_size` bytes, checked into entries_ and
  // metadata_.
  void parse_header(std::string_view json, std::uint64_t data_size);
  // Copies the entry's bytes to `out`.
  void read_data(const SafetensorsEntry& entry, void* out) const;

  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const ReadOnlyFile> source_;  // the file, held open
  std::uint64_t data_start_ = 0;                // its data section's first byte
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
