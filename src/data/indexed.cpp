#include "data/indexed.h"

#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"

namespace loom::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Element size of each dtype code Megatron defines for token ids (6 and 7 are floats).
std::size_t code_size(std::uint8_t code) {
  switch (code) {
    case 1:
    case 2:
      return 1;
    case 3:
    case 8:
      return 2;
    case 4:
      return 4;
    case 5:
      return 8;
    default:
      return 0;
  }
}

// Reads little-endian values from the index, naming the field on a short file.
struct Reader {
  const std::string& bytes;
  const std::string& path;
  std::size_t at = 0;
  template <class T>
  T take(const char* field) {
    check(at + sizeof(T) <= bytes.size(), path + ": ends inside field '" + field + "' (byte " +
                                              std::to_string(at) + " of " +
                                              std::to_string(bytes.size()) + ")");
    T value;
    std::memcpy(&value, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return value;
  }
};

std::int64_t element(const std::string& bin, std::size_t offset, std::uint8_t code) {
  const char* p = bin.data() + offset;
  switch (code) {
    case 1:
      return static_cast<unsigned char>(*p);
    case 2:
      return static_cast<signed char>(*p);
    case 3: {
      std::int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 8: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      std::int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

template <class T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

std::string indexed_prefix(const std::string& path) {
  for (const char* ext : {".bin", ".idx"})
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0)
      return path.substr(0, path.size() - 4);
  return path;
}

bool is_indexed_corpus(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(indexed_prefix(path) + ".idx", ec);
}

IndexedCorpus read_indexed(const std::string& path) {
  IndexedCorpus corpus;
  corpus.prefix = indexed_prefix(path);
  const std::string idx_path = corpus.prefix + ".idx", bin_path = corpus.prefix + ".bin";
  const std::string idx = io::read_whole_file(idx_path);
  const std::string bin = io::read_whole_file(bin_path);
  Reader r{idx, idx_path};
  for (char c : kMagic)
    check(r.take<char>("magic") == c,
          idx_path + ": field 'magic' is not MMIDIDX (not a Megatron indexed corpus index)");
  const auto version = r.take<std::uint64_t>("version");
  check(version == 1,
        idx_path + ": field 'version' is " + std::to_string(version) + ", expected 1");
  const auto code = r.take<std::uint8_t>("dtype");
  const std::size_t size = code_size(code);
  check(size > 0, idx_path + ": field 'dtype' is code " + std::to_string(code) +
                      ", expected an integer type (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 8 u16)");
  const auto sequences = r.take<std::uint64_t>("sequence count");
  const auto doc_count = r.take<std::uint64_t>("document count");
  // The three arrays must fill the rest of the file exactly.
  const unsigned __int128 expected = static_cast<unsigned __int128>(r.at) +
                                     static_cast<unsigned __int128>(sequences) * 12u +
                                     static_cast<unsigned __int128>(doc_count) * 8u;
  check(expected == idx.size(), idx_path + ": " + std::to_string(sequences) + " sequences and " +
                                    std::to_string(doc_count) + " document indices need " +
                                    (expected > std::numeric_limits<std::uint64_t>::max()
                                         ? std::string("more than 2^64")
                                         : std::to_string(static_cast<std::uint64_t>(expected))) +
                                    " bytes, the file has " + std::to_string(idx.size()));
  std::vector<std::int32_t> lengths(sequences);
  for (auto& length : lengths) {
    length = r.take<std::int32_t>("sequence lengths");
    check(length >= 0, idx_path + ": field 'sequence lengths' holds " + std::to_string(length));
  }
  std::vector<std::int64_t> pointers(sequences);
  for (auto& p : pointers)
    p = r.take<std::int64_t>("sequence pointers");
  std::vector<std::int64_t> docs(doc_count);
  for (auto& d : docs)
    d = r.take<std::int64_t>("document index");
  check(doc_count >= 1 && docs.front() == 0 && docs.back() == static_cast<std::int64_t>(sequences),
        idx_path + ": field 'document index' must run from 0 to the sequence count (" +
            std::to_string(sequences) + ")");
  for (std::size_t d = 1; d < docs.size(); ++d)
    check(docs[d] >= docs[d - 1],
          idx_path + ": field 'document index' goes backwards at entry " + std::to_string(d));
  std::vector<std::int64_t> sequence_starts(sequences + 1, 0);
  for (std::size_t s = 0; s < sequences; ++s) {
    const unsigned __int128 end = static_cast<unsigned __int128>(pointers[s]) +
                                  static_cast<unsigned __int128>(lengths[s]) * size;
    check(pointers[s] >= 0 && end <= bin.size(),
          idx_path + ": sequence " + std::to_string(s) + " (byte " + std::to_string(pointers[s]) +
              ", " + std::to_string(lengths[s]) + " ids) lies outside " + bin_path + " (" +
              std::to_string(bin.size()) + " bytes)");
    for (std::int32_t i = 0; i < lengths[s]; ++i) {
      const std::int64_t id = element(
          bin, static_cast<std::size_t>(pointers[s]) + static_cast<std::size_t>(i) * size, code);
      check(id >= 0 && id <= std::numeric_limits<std::int32_t>::max(),
            bin_path + ": token " + std::to_string(i) + " of sequence " + std::to_string(s) +
                " is " + std::to_string(id) + ", expected an id in [0, 2^31)");
      corpus.tokens.push_back(static_cast<std::int32_t>(id));
    }
    sequence_starts[s + 1] = static_cast<std::int64_t>(corpus.tokens.size());
  }
  for (std::int64_t d : docs)
    corpus.doc_offsets.push_back(sequence_starts[static_cast<std::size_t>(d)]);
  return corpus;
}

void write_indexed(const std::string& prefix, const std::vector<std::vector<std::int32_t>>& docs,
                   std::int64_t vocab) {
  const bool narrow = vocab < 65500;
  std::string bin, idx(kMagic, sizeof kMagic);
  std::vector<std::int64_t> pointers;
  for (const auto& doc : docs) {
    pointers.push_back(static_cast<std::int64_t>(bin.size()));
    for (std::int32_t id : doc) {
      check(id >= 0 && id < vocab, prefix + ": id " + std::to_string(id) +
                                       " is outside the vocabulary of " + std::to_string(vocab));
      if (narrow)
        append(bin, static_cast<std::uint16_t>(id));
      else
        append(bin, id);
    }
  }
  append(idx, std::uint64_t{1});
  append(idx, static_cast<std::uint8_t>(narrow ? 8 : 4));
  append(idx, static_cast<std::uint64_t>(docs.size()));
  append(idx, static_cast<std::uint64_t>(docs.size() + 1));
  for (const auto& doc : docs)
    append(idx, static_cast<std::int32_t>(doc.size()));
  for (std::int64_t p : pointers)
    append(idx, p);
  for (std::size_t d = 0; d <= docs.size(); ++d)
    append(idx, static_cast<std::int64_t>(d));
  io::write_file_atomically(prefix + ".bin", bin);
  io::write_file_atomically(prefix + ".idx", idx);
}

}  // namespace loom::data
