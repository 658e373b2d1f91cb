#include "train/sharded_checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/read_only_file.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

std::string shard_name(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "shard-%05d", rank);
  return name;
}

std::string hex8(uLong crc) {
  char text[16];
  std::snprintf(text, sizeof text, "%08lx", static_cast<unsigned long>(crc));
  return text;
}

// CRC-32 (zlib's) of bytes, as 8 hex digits.
std::string crc32_hex(const std::string& bytes) {
  const uLong crc =
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  return hex8(crc);
}

// The same of a file, read 8 MiB at a time (a shard may be gigabytes).
std::string crc32_hex(const io::ReadOnlyFile& file) {
  constexpr std::size_t kChunk = std::size_t{8} << 20;
  std::vector<unsigned char> chunk(std::min<std::uint64_t>(kChunk, file.size()));
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (std::uint64_t at = 0; at < file.size(); at += chunk.size()) {
    const std::size_t n = std::min<std::uint64_t>(chunk.size(), file.size() - at);
    file.read(at, n, chunk.data());
    crc = crc32_z(crc, chunk.data(), n);
  }
  return hex8(crc);
}

std::string dims(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A JSON array of integers >= lo with `rank` elements (any when rank < 0), else an error
// naming `where`.
std::vector<std::int64_t> integers(const nlohmann::json& j, const std::string& where,
                                   std::int64_t lo, long rank) {
  bool ok = j.is_array() && (rank < 0 || static_cast<long>(j.size()) == rank);
  for (const nlohmann::json& v : ok ? j : nlohmann::json::array())
    ok = ok && v.is_number_integer() && v.get<std::int64_t>() >= lo;
  check(ok, [&] {
    return where + " is " + j.dump() + ", expected a list of " +
           (rank >= 0 ? std::to_string(rank) + " " : "") + "integers >= " + std::to_string(lo);
  });
  return j.get<std::vector<std::int64_t>>();
}

const nlohmann::json& field(const nlohmann::json& j, const char* name, const std::string& where) {
  check(j.is_object() && j.contains(name), where + ": field '" + name + "' is missing");
  return j.at(name);
}

// The index's files: present, of the size and checksum it gives, then read.
std::vector<io::SafetensorsFile> read_files(const nlohmann::json& files, const std::string& folder,
                                            const std::string& where) {
  std::vector<io::SafetensorsFile> out;
  check(files.is_array() && !files.empty(),
        where + ": field 'files' is " + files.dump().substr(0, 80) + ", expected a list of files");
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string at = where + ": files[" + std::to_string(f) + "]";
    const nlohmann::json& name = field(files[f], "name", at);
    check(name.is_string() && name.get<std::string>().find('/') == std::string::npos &&
              !name.get<std::string>().empty() && name.get<std::string>()[0] != '.',
          at + ": field 'name' is " + name.dump() + ", expected a file name in the folder");
    const std::string path = folder + "/" + name.get<std::string>();
    std::error_code ec;
    check(fs::is_regular_file(path, ec), path + ": missing (the index " + where +
                                             " lists it as files[" + std::to_string(f) + "])");
    // Held open from here, so the bytes checked are the bytes later read.
    auto file = std::make_shared<const io::ReadOnlyFile>(path);
    const nlohmann::json& size = field(files[f], "bytes", at);
    check(size.is_number_unsigned() && size.get<std::uint64_t>() == file->size(),
          path + ": " + std::to_string(file->size()) + " bytes, the index " + where + " says " +
              size.dump());
    const nlohmann::json& crc = field(files[f], "crc32", at);
    const std::string actual = crc32_hex(*file);
    check(crc.is_string() && crc.get<std::string>() == actual,
          path + ": CRC-32 " + actual + ", the index " + where + " says " + crc.dump() +
              " (the file changed or is damaged)");
    out.push_back(io::SafetensorsFile::open(std::move(file)));
  }

  return out;
}

}  // namespace

void write_shard(const std::string& folder, int rank, const std::vector<ShardPiece>& pieces) {
  const std::string base = folder + "/" + shard_name(rank);
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::ordered_json manifest_pieces = nlohmann::ordered_json::object();
  for (const ShardPiece& p : pieces) {
    check(p.start.size() == p.shape.size() && p.value.shape().size() == p.shape.size(),
          p.name + ": a checkpoint piece needs a start per dimension of its tensor");
    check(!manifest_pieces.contains(p.name),
          base + ".safetensors: two pieces of tensor '" + p.name + "' (one per rank)");
    tensors.emplace_back(p.name, p.value);
    manifest_pieces[p.name] = {{"shape", p.shape}, {"start", p.start}};
  }
  const std::string bytes =
      io::safetensors_bytes(base + ".safetensors", tensors, {{"format", "pt"}});
  io::write_file_atomically(base + ".safetensors", bytes);
  nlohmann::ordered_json manifest{{"file", shard_name(rank) + ".safetensors"},
                                  {"bytes", bytes.size()},
                                  {"crc32", crc32_hex(bytes)},
                                  {"pieces", manifest_pieces}};
  io::write_file_atomically(base + ".json", manifest.dump(1));
}

void write_index(const std::string& folder, int writers,
                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array(),
                         tensors = nlohmann::ordered_json::object();
  for (int r = 0; r < writers; ++r) {
    const std::string path = folder + "/" + shard_name(r) + ".json";
    const nlohmann::json m = nlohmann::json::parse(io::read_whole_file(path), nullptr, false);
    check(m.is_object(), path + ": a shard manifest that is not JSON");
    const std::size_t file = files.size();
    files.push_back({{"name", field(m, "file", path)},
                     {"bytes", field(m, "bytes", path)},
                     {"crc32", field(m, "crc32", path)}});
    for (const auto& [name, piece] : field(m, "pieces", path).items()) {
      nlohmann::ordered_json& t = tensors[name];
      if (t.is_null())
        t = {{"dtype", "F32"},
             {"shape", field(piece, "shape", path)},
             {"pieces", nlohmann::ordered_json::array()}};
      // (compared as text: an ordered_json and a json have no common operator== in clang)
      check(t["shape"].dump() == field(piece, "shape", path).dump(),
            path + ": tensor '" + name + "' has shape " + piece["shape"].dump() + " here and " +
                t["shape"].dump() + " in an earlier shard");
      t["pieces"].push_back({{"file", file}, {"start", field(piece, "start", path)}});
    }
  }
  nlohmann::ordered_json index{{"format", kShardedFormat},
                               {"version", kShardedFormatVersion},
                               {"metadata", metadata},
                               {"files", files},
                               {"tensors", tensors}};
  io::write_file_atomically(folder + "/index.json", index.dump(1));
  for (int r = 0; r < writers; ++r) {  // the index holds what they said
    std::error_code ec;
    fs::remove(folder + "/" + shard_name(r) + ".json", ec);
  }
}

bool is_sharded_checkpoint(const std::string& folder) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(folder) / "index.json", ec);
}

ShardedCheckpoint ShardedCheckpoint::open(const std::string& folder) {
  ShardedCheckpoint c;
  c.folder_ = folder;
  c.index_path_ = folder + "/index.json";
  const std::string& where = c.index_path_;
  const nlohmann::json index = nlohmann::json::parse(io::read_whole_file(where), nullptr, false);
  check(index.is_object(), where + ": not a JSON object (a sharded checkpoint's index)");
  const nlohmann::json& format = field(index, "format", where);
  check(format == kShardedFormat,
        where + ": field 'format' is " + format.dump() + ", expected \"" + kShardedFormat + "\"");
  const nlohmann::json& version = field(index, "version", where);
  check(version.is_number_integer() && version.get<std::int64_t>() >= 1,
        where + ": field 'version' is " + version.dump() + ", expected an integer >= 1");
  check(version.get<std::int64_t>() <= kShardedFormatVersion,
        where + ": format version " + version.dump() +
            " was written by a newer Loom; this one reads versions up to " +
            std::to_string(kShardedFormatVersion));
  const nlohmann::json& metadata = field(index, "metadata", where);
  check(metadata.is_object(), where + ": field 'metadata' is not an object");
  for (const auto& [key, value] : metadata.items()) {
    check(value.is_string(),
          where + ": metadata '" + key + "' is " + value.dump() + ", expected a string");
    c.metadata_[key] = value.get<std::string>();
  }

  c.files_ = read_files(field(index, "files", where), folder, where);

  // The tensors: each piece in its file, inside its tensor; the pieces tile it.
  std::vector<std::set<std::string>> named(c.files_.size());
  const nlohmann::json& tensors = field(index, "tensors", where);
  check(tensors.is_object(), where + ": field 'tensors' is not an object");
  for (const auto& [name, t] : tensors.items())
    c.tensors_[name] = c.read_tensor(name, t, named);
  for (std::size_t f = 0; f < c.files_.size(); ++f)
    for (const io::SafetensorsEntry& e : c.files_[f].entries())
      check(named[f].count(e.name) != 0, c.files_[f].path() + ": tensor '" + e.name +
                                             "' is not in the index " + where +
                                             " (the index and its files disagree)");
  return c;
}

ShardedCheckpoint::Logical ShardedCheckpoint::read_tensor(
    const std::string& name, const nlohmann::json& t,
    std::vector<std::set<std::string>>& named) const {
  const std::string& where = index_path_;
  const std::string at = where + ": tensor '" + name + "'";
  const nlohmann::json& dtype = field(t, "dtype", at);
  check(dtype == "F32", at + ": dtype " + dtype.dump() + ", expected \"F32\"");
  Logical logical;
  logical.shape = integers(field(t, "shape", at), at + ": shape", 0, -1);
  const nlohmann::json& pieces = field(t, "pieces", at);
  check(pieces.is_array() && !pieces.empty(),
        at + ": field 'pieces' is " + pieces.dump() + ", expected a non-empty list");
  const auto rank = static_cast<long>(logical.shape.size());
  std::int64_t covered = 0;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const std::string pat = at + " piece " + std::to_string(k);
    const nlohmann::json& file = field(pieces[k], "file", pat);
    check(file.is_number_unsigned() && file.get<std::uint64_t>() < files_.size(),
          pat + ": field 'file' is " + file.dump() + ", expected an index into 'files' (0 to " +
              std::to_string(files_.size() - 1) + ")");
    Piece piece;
    piece.file = file.get<std::size_t>();
    check(named[piece.file].count(name) == 0, [&] {  // a file holds one tensor of a name
      return pat + ": the index places a second piece of it in " + files_[piece.file].path() +
             ", which holds one tensor of that name";
    });
    piece.start = integers(field(pieces[k], "start", pat), pat + ": start", 0, rank);
    const io::SafetensorsFile& sf = files_[piece.file];
    const io::SafetensorsEntry* e = sf.find(name);
    check(e != nullptr, sf.path() + ": tensor '" + name + "' is missing (the index " + where +
                            " places piece " + std::to_string(k) + " of it there)");
    check(e->dtype == DType::f32, sf.path() + ": tensor '" + name + "' is " +
                                      std::string(safetensors_name(e->dtype)) + ", the index " +
                                      where + " says F32");
    piece.shape = e->shape;
    check(static_cast<long>(piece.shape.size()) == rank, [&] {
      return sf.path() + ": tensor '" + name + "' has shape " + shape_str(piece.shape) +
             ", not a slice of the index's " + shape_str(logical.shape);
    });
    for (std::size_t d = 0; d < piece.shape.size(); ++d)
      // (in this order, so no sum overflows: a piece's sizes are its file's)
      check(
          piece.shape[d] <= logical.shape[d] && piece.start[d] <= logical.shape[d] - piece.shape[d],
          [&] {
            return sf.path() + ": tensor '" + name + "' of shape " + shape_str(piece.shape) +
                   " at " + dims(piece.start) + " reaches past the index's shape " +
                   shape_str(logical.shape);
          });
    for (const Piece& other : logical.pieces) {  // disjoint from every earlier piece
      bool overlap = true;
      for (std::size_t d = 0; d < piece.shape.size(); ++d)
        overlap = overlap && piece.start[d] < other.start[d] + other.shape[d] &&
                  other.start[d] < piece.start[d] + piece.shape[d];
      check(!overlap, [&] {
        return at + ": pieces at " + dims(piece.start) + " and " + dims(other.start) + " overlap";
      });
    }
    covered += shape_numel(piece.shape);
    named[piece.file].insert(name);
    logical.pieces.push_back(std::move(piece));
  }
  // The tensor's elements, counted without overflow (an index may claim any shape).
  std::int64_t elements = 1;
  bool overflow = false;
  for (std::int64_t n : logical.shape)
    overflow = __builtin_mul_overflow(elements, n, &elements) || overflow;
  if (std::find(logical.shape.begin(), logical.shape.end(), 0) != logical.shape.end())
    elements = 0, overflow = false;
  check(!overflow && covered == elements, [&] {
    return at + ": its pieces hold " + std::to_string(covered) + " of its " +
           (overflow ? "more than 2^63" : std::to_string(elements)) +
           " elements (a shard is missing)";
  });
  return logical;
}

const Shape& ShardedCheckpoint::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  check(it != tensors_.end(), index_path_ + ": tensor '" + name + "' is missing");
  return it->second.shape;
}

std::vector<std::string> ShardedCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_)
    out.push_back(name);
  return out;
}

Tensor ShardedCheckpoint::load(const std::string& name, Backend& backend) const {
  auto it = tensors_.find(name);
  check(it != tensors_.end(), index_path_ + ": tensor '" + name + "' is missing");
  const Logical& t = it->second;
  if (t.pieces.size() == 1) {  // one piece tiles it: the piece is the tensor
    const io::SafetensorsFile& file = files_[t.pieces[0].file];
    return file.load_f32(*file.find(name), backend);
  }
  std::vector<float> whole(static_cast<std::size_t>(shape_numel(t.shape)));
  // Row-major strides of the whole tensor; each piece is copied a run of its last dimension
  // at a time.
  const std::size_t rank = t.shape.size();
  std::vector<std::int64_t> stride(rank, 1);
  for (std::size_t d = rank; d-- > 1;)
    stride[d - 1] = stride[d] * t.shape[d];
  for (const Piece& p : t.pieces) {
    const io::SafetensorsFile& file = files_[p.file];
    const std::vector<float> values = file.floats(*file.find(name));
    const std::int64_t run = p.shape[rank - 1],
                       runs = shape_numel(p.shape) / std::max<std::int64_t>(run, 1);
    std::vector<std::int64_t> at(rank, 0);  // the run's index within the piece (last dim 0)
    for (std::int64_t r = 0; r < runs && run > 0; ++r) {
      std::int64_t offset = 0;
      for (std::size_t d = 0; d < rank; ++d)
        offset += (p.start[d] + at[d]) * stride[d];
      std::copy_n(values.begin() + r * run, run, whole.begin() + offset);
      for (std::size_t d = rank - 1; d-- > 0;) {  // the next run: odometer over the outer dims
        if (++at[d] < p.shape[d])
          break;
        at[d] = 0;
      }
    }
  }
  return Tensor::from_floats(t.shape, whole, backend);
}

}  // namespace loom::train
