// data/indexed.h — Megatron's indexed corpora (megatron-core's IndexedDataset; MindSpeed and
// Megatron-LM's preprocess_data.py write and read the same): PREFIX.bin holds every token id
// of every document back to back, in one integer type; PREFIX.idx holds
//   magic "MMIDIDX\0\0", version (u64 = 1), dtype code (u8: 1 u8, 2 i8, 3 i16, 4 i32,
//   5 i64, 8 u16), sequence count (u64), document index count (u64), the sequence lengths
//   (i32 each), their byte offsets into .bin (i64 each), the document index (i64 each:
//   where each document's sequences begin, then the count).
// Loom writes one sequence per document (document index 0, 1, ..., n), as preprocess_data.py
// does without sentence splitting, and reads any number of sequences per document.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct IndexedCorpus {
  std::vector<std::int32_t> tokens;       // every sequence's ids, in order
  std::vector<std::int64_t> doc_offsets;  // where each document starts in `tokens`, then the end
  std::string prefix;                     // PREFIX of PREFIX.bin / PREFIX.idx
  std::int64_t documents() const { return static_cast<std::int64_t>(doc_offsets.size()) - 1; }
};

// The prefix a corpus path names: PREFIX, PREFIX.bin or PREFIX.idx.
std::string indexed_prefix(const std::string& path);
// Whether `path` names an indexed corpus (PREFIX.idx exists).
bool is_indexed_corpus(const std::string& path);

// Reads PREFIX.idx and PREFIX.bin whole. A bad magic or version, a dtype code the format does
// not define, a count that does not match the file's size, a sequence outside .bin, a
// document index that goes backwards or misses the ends, an id that is negative or beyond
// int32: an error naming the file, the field and the value.
IndexedCorpus read_indexed(const std::string& path);

// Writes one sequence per document, in uint16 when every id fits below 65,500 (Megatron's
// choice for such vocabularies), else int32: PREFIX.bin, then PREFIX.idx, each atomically,
// so a reader never finds an index without its data.
void write_indexed(const std::string& prefix, const std::vector<std::vector<std::int32_t>>& docs,
                   std::int64_t vocab);

}  // namespace loom::data
