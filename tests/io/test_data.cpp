#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "data/idx.h"
#include "data/text.h"
#include "test_util.h"

namespace loom::testing {
namespace {

TEST(TextData, CharVocabularyAndSplitAsNanoGpt) {
  data::TextDataset ds = data::TextDataset::load(source_dir() + "/data/tinyshakespeare/input.txt");
  EXPECT_EQ(ds.vocab(), 65);  // nanoGPT's shakespeare_char
  EXPECT_EQ(ds.train().size(), 1003854u);
  EXPECT_EQ(ds.val().size(), 111540u);
  EXPECT_EQ(ds.tokenizer().decode({ds.tokenizer().encode_char(U'a')}), "a");
  EXPECT_EQ(ds.tokenizer().alphabet().front(), U'\n');
}

TEST(TextData, Utf8IsDecodedAndValidated) {
  std::string dir = temp_dir("text");
  { std::ofstream(dir + "/u.txt") << "héllo wörld ✓"; }
  data::TextDataset ds = data::TextDataset::load(dir + "/u.txt");
  EXPECT_EQ(ds.tokenizer().decode(ds.tokenizer().encode(data::decode_utf8("ö✓", "t"), "t")), "ö✓");
  { std::ofstream(dir + "/bad.txt") << "ok\xff\xfe"; }
  try {
    data::TextDataset::load(dir + "/bad.txt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt: invalid UTF-8 at byte 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(data::TextDataset::load(dir + "/missing.txt"), Error);
}

TEST(TextData, BatchesAreDeterministicAndShifted) {
  data::TextDataset ds = data::TextDataset::random(50, 10000, 3);
  data::Batch a = ds.sample(ds.train(), 4, 16, 99, cpu()), b = ds.sample(ds.train(), 4, 16, 99, cpu());
  EXPECT_EQ(a.inputs.to_ints(), b.inputs.to_ints());
  std::vector<std::int32_t> x = a.inputs.to_ints(), y = a.targets.to_ints();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(x[i + 1], y[i]);  // targets are inputs shifted by one
  auto windows = data::eval_windows(ds.val(), 16, 8, cpu());
  std::int64_t count = 0;
  for (auto& w : windows) count += w.inputs.dim(0);
  EXPECT_EQ(count, (1000 - 1) / 16);
}

TEST(IdxData, MnistLoadsAndBadFilesAreNamed) {
  std::string m = source_dir() + "/data/mnist";
  data::ImageSet test = data::load_idx(m + "/t10k-images-idx3-ubyte.gz", m + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(test.rows, 28);
  EXPECT_EQ(test.labels[0], 7);  // the canonical first test digit
  try {
    data::load_idx(m + "/t10k-labels-idx1-ubyte.gz", m + "/t10k-labels-idx1-ubyte.gz");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("magic = 2049, expected 2051"), std::string::npos) << e.what();
  }
  // A labels file whose count disagrees with the images file.
  std::string dir = temp_dir("idx");
  {
    std::ofstream f(dir + "/labels", std::ios::binary);
    const unsigned char header[8] = {0, 0, 8, 1, 0, 0, 0, 5};
    f.write(reinterpret_cast<const char*>(header), 8);
    f.write("\1\2\3\4\5", 5);
  }
  try {
    data::load_idx(m + "/t10k-images-idx3-ubyte.gz", dir + "/labels");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("labels: count = 5, but"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::testing
