// data/tokenizer.h — subword tokenizers of the formats models are shipped with:
//   tokenizer.json   Hugging Face `tokenizers`' byte-level BPE (GPT-2, Llama 3, Qwen2 and
//                    their kin): added and special tokens, an NFC normaliser, Split
//                    pre-tokenizers by regex (PCRE2, Unicode properties) and ByteLevel
//   tokenizer.model  SentencePiece models (Llama 2, Mistral, TinyLlama; BPE or unigram), run
//                    by libsentencepiece itself in the helper process loom-sentencepiece
//                    (data/sentencepiece_protocol.h says why it is a process of its own)
// Ids are the model's own ids, without any post-processor's additions (no BOS/EOS added):
// exactly what `tokenizers` gives with add_special_tokens=False, and what sentencepiece's
// encode gives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view utf8) const = 0;
  // The text of the ids (bytes that need not be whole UTF-8 characters at the ends).
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  // The id of a token string (a special token's content), if the vocabulary has it.
  virtual std::optional<std::int32_t> token_id(std::string_view token) const = 0;
  // The end-of-document token, where the tokenizer names one.
  virtual std::optional<std::int32_t> eos() const = 0;
  virtual std::string kind() const = 0;  // "byte-level BPE", "SentencePiece"
};

// A tokenizer from a tokenizer.json or tokenizer.model file, or a folder holding one
// (tokenizer.json first where it holds both). Errors name the file, the field and what was
// expected.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The tokenizer file a path names: the file itself, or the one in the folder.
std::string tokenizer_file_path(const std::string& path);
// By format (load_tokenizer chooses): data/bpe_tokenizer.cpp, data/sentencepiece_tokenizer.cpp.
std::unique_ptr<Tokenizer> load_byte_level_bpe(const std::string& tokenizer_json);
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& tokenizer_model);

// Megatron's preprocessing: each input file a document (text), or each line of a .jsonl file
// a document (its `json_key` field), tokenized, with the tokenizer's end-of-document token
// after each (append_eos), written as PREFIX.bin and PREFIX.idx (data/indexed.h). Returns the
// documents and tokens written. Errors name the file, the line and the field.
struct PreparedCorpus {
  std::int64_t documents = 0, tokens = 0;
};
PreparedCorpus prepare_corpus(const std::string& tokenizer_path,
                              const std::vector<std::string>& inputs, const std::string& json_key,
                              bool append_eos, const std::string& out_prefix);

}  // namespace loom::data
