// data/text.h — character-level text data, as nanoGPT's shakespeare_char: the vocabulary
// is the sorted set of distinct characters (Unicode code points) of the file; the first
// 90% of tokens train, the last 10% validate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::data {

class CharTokenizer {
 public:
  CharTokenizer() = default;
  explicit CharTokenizer(std::vector<char32_t> alphabet);  // sorted, distinct
  static CharTokenizer from_text(const std::u32string& text);

  std::int32_t encode_char(char32_t c) const;  // -1 when not in the vocabulary
  std::vector<std::int32_t> encode(const std::u32string& text, const std::string& what) const;
  std::string decode(const std::vector<std::int32_t>& ids) const;  // UTF-8
  std::int64_t size() const { return static_cast<std::int64_t>(alphabet_.size()); }
  const std::vector<char32_t>& alphabet() const { return alphabet_; }
  std::string alphabet_utf8() const;

 private:
  std::vector<char32_t> alphabet_;
};

// Decodes UTF-8; throws naming `what` (e.g. the file) and the byte offset of bad input.
std::u32string decode_utf8(const std::string& bytes, const std::string& what);
std::string encode_utf8(const std::u32string& text);

struct Batch {
  Tensor inputs;   // [B,T] i32 token ids, or [N,C,H,W] f32 images
  Tensor targets;  // [B*T] or [N] i32
};

class TextDataset {
 public:
  // Reads and tokenises a UTF-8 file; throws naming the file on any problem.
  static TextDataset load(const std::string& path);
  // Token ids made elsewhere (a subword tokenizer, an indexed corpus): the first 90% train,
  // the last 10% validate, as with characters. Every id must be below `vocab`.
  static TextDataset from_ids(std::vector<std::int32_t> ids, std::int64_t vocab,
                              const std::string& source);
  // Uniform random tokens in [0, vocab) (benchmarks): `tokens` of them.
  static TextDataset random(std::int64_t vocab, std::int64_t tokens, std::uint64_t seed);

  const CharTokenizer& tokenizer() const { return tokenizer_; }
  std::int64_t vocab() const { return vocab_; }
  const std::vector<std::int32_t>& train() const { return train_; }
  const std::vector<std::int32_t>& val() const { return val_; }
  const std::string& source() const { return source_; }

  // B random windows of T+1 tokens from `split` (nanoGPT's get_batch), drawn with `seed`.
  Batch sample(const std::vector<std::int32_t>& split, std::int64_t batch, std::int64_t context,
               std::uint64_t seed, Backend& backend) const;

 private:
  CharTokenizer tokenizer_;
  std::int64_t vocab_ = 0;
  std::vector<std::int32_t> train_, val_;
  std::string source_;
};

// All consecutive non-overlapping windows of `context` (+1 target) tokens of `tokens`,
// grouped `batch` windows at a time: the deterministic evaluation set. With
// `full_batches_only` the last (windows % batch) windows are left out, for models whose
// batch size is fixed.
std::vector<Batch> eval_windows(const std::vector<std::int32_t>& tokens, std::int64_t context,
                                std::int64_t batch, Backend& backend,
                                bool full_batches_only = false);

}  // namespace loom::data
