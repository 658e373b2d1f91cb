#include <gtest/gtest.h>

#include <algorithm>
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

// A text too short to train on is named with its length, when loaded (under two characters)
// or when a window longer than a split is asked for, never read past its end.
TEST(TextData, TextsTooShortAreNamed) {
  std::string dir = temp_dir("text_short");
  { std::ofstream(dir + "/one.txt") << "a"; }
  EXPECT_NE(error_of([&] {
              data::TextDataset::load(dir + "/one.txt");
            }).find("one.txt: holds 1 characters; expected at least 2"),
            std::string::npos);
  { std::ofstream(dir + "/short.txt") << "to be or not to be, that is the question"; }
  data::TextDataset ds = data::TextDataset::load(dir + "/short.txt");
  const std::string e = error_of([&] { ds.sample(ds.train(), 2, 64, 1, cpu()); });
  EXPECT_NE(e.find("short.txt: split has 36 tokens; context = 64 needs at least 65"),
            std::string::npos)
      << e;
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

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// count x rows x cols = 4 x 2^31 x 2^31 = 2^64 wrapped to 0 before, so a 16-byte file
// "held" four 2^62-pixel images, and the first batch read far outside the pixels.
TEST(IdxData, HeaderSizesThatOverflowAreNamed) {
  std::string dir = temp_dir("idx-overflow");
  write_bytes(dir + "/wrap-images.idx", {0, 0, 8, 3, 0, 0, 0, 4, 0x80, 0, 0, 0, 0x80, 0, 0, 0});
  write_bytes(dir + "/wrap-labels.idx", {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 4});
  std::string message =
      error_of([&] { data::load_idx(dir + "/wrap-images.idx", dir + "/wrap-labels.idx"); });
  EXPECT_NE(message.find("wrap-images.idx: rows = 2147483648, expected 1..65536"),
            std::string::npos)
      << message;
  // Within the row and column limits, a count that does not match the bytes is named
  // with the header's numbers, and one whose pixel count overflows says so.
  write_bytes(dir + "/short-images.idx", {0, 0, 8, 3, 0, 0, 0, 4, 0, 1, 0, 0, 0, 1, 0, 0, 7});
  message = error_of([&] { data::load_idx(dir + "/short-images.idx", dir + "/wrap-labels.idx"); });
  EXPECT_NE(message.find("short-images.idx: 17 bytes, header promises 4 x 65536 x 65536 = "
                         "17179869184 pixels after the 16-byte header"),
            std::string::npos)
      << message;
  write_bytes(dir + "/count-images.idx",
              {0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0, 1, 0, 0, 0, 1, 0, 0});
  message = error_of([&] { data::load_idx(dir + "/count-images.idx", dir + "/wrap-labels.idx"); });
  EXPECT_NE(message.find("count-images.idx: header count 4294967295 x rows 65536 x cols 65536"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("overflows int64"), std::string::npos) << message;
}

// Every hostile pair kept in tests/fixtures/fuzz/idx (NAME-images.idx, NAME-labels.idx)
// gives a loom::Error naming one of its files; nothing crashes.
TEST(IdxData, FuzzFixturesGiveNamedErrors) {
  std::vector<std::string> files = fuzz_inputs("idx");
  int pairs = 0;
  for (const std::string& images : files) {
    const std::string suffix = "-images.idx";
    if (images.size() < suffix.size() ||
        images.compare(images.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string labels = images.substr(0, images.size() - suffix.size()) + "-labels.idx";
    SCOPED_TRACE(images);
    std::string message = error_of([&] {
      data::ImageSet set = data::load_idx(images, labels);
      std::vector<std::int64_t> order(static_cast<std::size_t>(set.count));
      for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = static_cast<std::int64_t>(i);
      data::image_batch(set, order, 0, std::min<std::int64_t>(set.count, 2), cpu());
    });
    EXPECT_TRUE(message.find(images) != std::string::npos ||
                message.find(labels) != std::string::npos)
        << message;
    ++pairs;
  }
  EXPECT_GT(pairs, 0);
}

}  // namespace
}  // namespace loom::testing
