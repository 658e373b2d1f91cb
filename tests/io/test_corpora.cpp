// Megatron indexed corpora: what Loom writes reads back, what megatron-core wrote
// (tests/fixtures/corpora, tools/make_corpus_fixture.py) reads as that library read it, and
// a damaged index or data file is named, not guessed at.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/indexed.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace loom::testing {
namespace {

std::string tokenizer_dir() {
  return source_dir() + "/tests/fixtures/tokenizers/llama3";
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(IndexedCorpus, WrittenDocumentsReadBackWithTheirBoundaries) {
  const std::string prefix = temp_dir("indexed") + "/corpus";
  std::vector<std::vector<std::int32_t>> docs{{1, 2, 3}, {}, {65498, 0}, {7}};
  data::write_indexed(prefix, docs, 65499);
  data::IndexedCorpus c = data::read_indexed(prefix + ".bin");
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{1, 2, 3, 65498, 0, 7}));
  EXPECT_EQ(c.doc_offsets, (std::vector<std::int64_t>{0, 3, 3, 5, 6}));
  EXPECT_EQ(bytes_of(prefix + ".idx")[17], 8);  // dtype code: uint16 below 65,500 ids
  data::write_indexed(prefix, docs, 70000);     // a larger vocabulary: int32
  EXPECT_EQ(bytes_of(prefix + ".idx")[17], 4);
  EXPECT_EQ(data::read_indexed(prefix).tokens, c.tokens);
}

TEST(IndexedCorpus, PreparedTextAndJsonlHoldEachDocumentsIdsThenEos) {
  const std::string dir = temp_dir("prepare");
  std::ofstream(dir + "/a.txt") << "Ёжик в тумане.";
  std::ofstream(dir + "/b.jsonl") << R"({"text": "Grüße aus Köln", "id": 1})"
                                  << "\n\n"
                                  << R"({"text": "it's 2024"})"
                                  << "\n";
  data::PreparedCorpus p = data::prepare_corpus(tokenizer_dir(), {dir + "/a.txt", dir + "/b.jsonl"},
                                                "text", true, dir + "/corpus");
  auto tok = data::load_tokenizer(tokenizer_dir());
  std::vector<std::int32_t> expected;
  for (const char* text : {"Ёжик в тумане.", "Grüße aus Köln", "it's 2024"}) {
    auto ids = tok->encode(text);
    expected.insert(expected.end(), ids.begin(), ids.end());
    expected.push_back(*tok->eos());
  }
  data::IndexedCorpus c = data::read_indexed(dir + "/corpus");
  EXPECT_EQ(p.documents, 3);
  EXPECT_EQ(c.documents(), 3);
  EXPECT_EQ(c.tokens, expected);
  EXPECT_EQ(p.tokens, static_cast<std::int64_t>(expected.size()));

  std::ofstream(dir + "/bad.jsonl") << R"({"text": "fine"})"
                                    << "\n"
                                    << R"({"body": "x"})"
                                    << "\n";
  std::string e = error_of([&] {
    data::prepare_corpus(tokenizer_dir(), {dir + "/bad.jsonl"}, "text", true, dir + "/bad");
  });
  EXPECT_NE(e.find("bad.jsonl: line 2: field 'text' is missing"), std::string::npos) << e;
}

// What megatron-core's IndexedDatasetBuilder wrote, with the documents it read back.
TEST(IndexedCorpus, ACorpusMegatronCoreWroteReadsAsItReadsIt) {
  const std::string fixtures = source_dir() + "/tests/fixtures/corpora";
  nlohmann::json expected = nlohmann::json::parse(bytes_of(fixtures + "/megatron.json"));
  data::IndexedCorpus c = data::read_indexed(fixtures + "/megatron");
  ASSERT_EQ(c.documents(), static_cast<std::int64_t>(expected["documents"].size()));
  for (std::size_t d = 0; d < expected["documents"].size(); ++d) {
    std::vector<std::int32_t> doc(c.tokens.begin() + c.doc_offsets[d],
                                  c.tokens.begin() + c.doc_offsets[d + 1]);
    EXPECT_EQ(doc, expected["documents"][d].get<std::vector<std::int32_t>>()) << "document " << d;
  }
}

TEST(IndexedCorpus, ADamagedIndexOrDataFileIsNamed) {
  const std::string prefix = temp_dir("damaged") + "/corpus";
  data::write_indexed(prefix, {{1, 2, 3}, {4, 5}}, 100);
  const std::string idx = bytes_of(prefix + ".idx"), bin = bytes_of(prefix + ".bin");
  auto refusal = [&](const std::string& new_idx, const std::string& new_bin) {
    std::ofstream(prefix + ".idx", std::ios::binary) << new_idx;
    std::ofstream(prefix + ".bin", std::ios::binary) << new_bin;
    return error_of([&] { data::read_indexed(prefix); });
  };
  std::string bad_magic = idx;
  bad_magic[0] = 'X';
  EXPECT_NE(refusal(bad_magic, bin).find("corpus.idx: field 'magic' is not MMIDIDX"),
            std::string::npos);
  std::string float_dtype = idx;
  float_dtype[17] = 7;
  EXPECT_NE(refusal(float_dtype, bin).find("field 'dtype' is code 7"), std::string::npos);
  std::string e = refusal(idx.substr(0, idx.size() - 3), bin);
  EXPECT_NE(e.find("2 sequences and 3 document indices need"), std::string::npos) << e;
  e = refusal(idx, bin.substr(0, bin.size() - 2));
  EXPECT_NE(e.find("sequence 1 (byte 6, 2 ids) lies outside"), std::string::npos) << e;
  e = refusal(idx.substr(0, 20), bin);
  EXPECT_NE(e.find("ends inside field 'sequence count'"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::testing
