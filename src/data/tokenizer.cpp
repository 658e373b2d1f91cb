// Tokenizers by file format, and Megatron's corpus preparation through any of them.
#include "data/tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed.h"
#include "io/atomic_file.h"

namespace loom::data {

using Json = nlohmann::json;

std::string tokenizer_file_path(const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string path = given;
  if (fs::is_directory(given, ec)) {
    // A Hugging Face folder may hold both: tokenizer.json is the fast tokenizer's whole
    // definition, tokenizer.model the SentencePiece model it was converted from.
    path = (fs::path(given) / "tokenizer.json").string();
    if (!fs::exists(path, ec) && fs::exists(fs::path(given) / "tokenizer.model", ec))
      path = (fs::path(given) / "tokenizer.model").string();
    check(fs::exists(path, ec),
          given + ": holds no tokenizer (tokenizer.json or a SentencePiece tokenizer.model)");
  }
  check(fs::exists(path, ec), path + ": no such tokenizer file");
  return path;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& given) {
  const std::string path = tokenizer_file_path(given);
  const bool sentencepiece = path.size() >= 6 && path.compare(path.size() - 6, 6, ".model") == 0;
  return sentencepiece ? load_sentencepiece(path) : load_byte_level_bpe(path);
}

PreparedCorpus prepare_corpus(const std::string& tokenizer_path,
                              const std::vector<std::string>& inputs, const std::string& json_key,
                              bool append_eos, const std::string& out_prefix) {
  check(!inputs.empty(), "data prepare: no input files");
  auto tokenizer = load_tokenizer(tokenizer_path);
  const std::optional<std::int32_t> eos = tokenizer->eos();
  check(!append_eos || eos.has_value(),
        tokenizer_file_path(tokenizer_path) +
            ": names no end-of-document token (<|endoftext|>, <|end_of_text|>, </s>, <eos>) "
            "to put after each document");
  std::vector<std::vector<std::int32_t>> docs;
  PreparedCorpus result;
  auto add = [&](std::string_view text) {
    docs.push_back(tokenizer->encode(text));
    if (append_eos)
      docs.back().push_back(*eos);
    result.tokens += static_cast<std::int64_t>(docs.back().size());
  };
  for (const std::string& input : inputs) {
    const std::string text = io::read_whole_file(input);
    const bool jsonl = input.size() > 6 && input.compare(input.size() - 6, 6, ".jsonl") == 0;
    if (!jsonl) {
      add(text);
      continue;
    }
    std::size_t line_number = 0;
    for (std::size_t at = 0; at < text.size();) {
      std::size_t end = text.find('\n', at);
      if (end == std::string::npos)
        end = text.size();
      const std::string_view line(text.data() + at, end - at);
      ++line_number;
      at = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos)
        continue;  // blank lines hold no document
      const Json record = Json::parse(line, nullptr, false);
      const std::string where = input + ": line " + std::to_string(line_number);
      check(!record.is_discarded() && record.is_object(), where + ": not a JSON object");
      check(record.contains(json_key) && record[json_key].is_string(),
            where + ": field '" + json_key + "' is " +
                (record.contains(json_key) ? record[json_key].dump() : std::string("missing")) +
                ", expected a string (the document's text)");
      add(record[json_key].get<std::string>());
    }
  }
  write_indexed(out_prefix, docs, tokenizer->vocab_size());
  result.documents = static_cast<std::int64_t>(docs.size());
  return result;
}

}  // namespace loom::data
