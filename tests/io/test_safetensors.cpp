#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace loom::testing {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}
// A file with the given JSON header and `data_bytes` zero bytes of data.
std::string with_header(const std::string& json, std::size_t data_bytes) {
  std::string out(8, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

void expect_error(const std::string& path, const std::string& needle) {
  try {
    io::SafetensorsFile::read(path);
    FAIL() << "no error for " << needle;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(Safetensors, RoundTripWithMetadata) {
  std::string dir = temp_dir("st");
  nn::Rng rng(1);
  Tensor a = random({3, 4}, rng), b = random({5}, rng), scalar = random({}, rng);
  io::write_safetensors(dir + "/x.safetensors",
                        {{"a", a}, {"b.c", b.transpose(0, 0)}, {"s", scalar}}, {{"step", "7"}});
  io::SafetensorsFile f = io::SafetensorsFile::read(dir + "/x.safetensors");
  EXPECT_EQ(f.metadata().at("step"), "7");
  EXPECT_EQ(f.load_f32(*f.find("a"), cpu()).to_floats(), a.to_floats());
  EXPECT_EQ(f.load_f32(*f.find("b.c"), cpu()).to_floats(), b.to_floats());
  EXPECT_EQ(f.find("s")->shape, Shape{});
  EXPECT_EQ(f.find("missing"), nullptr);
  // No temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir))
    ++files;
  EXPECT_EQ(files, 1);
}

// Reading takes the header; each tensor's bytes are read when it is loaded, from the file
// as it was opened: a newer file renamed into place does not change what the reader sees,
// and a file cut short since is a named error, not garbage.
TEST(Safetensors, TensorsAreReadFromTheFileAsItWasOpened) {
  std::string dir = temp_dir("st-lazy");
  nn::Rng rng(2);
  Tensor a = random({64, 32}, rng), b = random({16}, rng);
  const std::string path = dir + "/x.safetensors";
  io::write_safetensors(path, {{"a", a}, {"b", b}}, {});
  io::SafetensorsFile f = io::SafetensorsFile::read(path);
  io::write_safetensors(path, {{"a", random({64, 32}, rng)}, {"b", random({16}, rng)}}, {});
  EXPECT_EQ(f.load_f32(*f.find("a"), cpu()).to_floats(), a.to_floats());
  EXPECT_EQ(f.floats(*f.find("b")), b.to_floats());

  io::SafetensorsFile g = io::SafetensorsFile::read(path);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4 * 16 - 8);
  try {
    g.load_f32(*g.find("a"), cpu());  // its last bytes are gone ("b" follows it)
    FAIL() << "no error for a file cut short after it was opened";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("shrank"), std::string::npos) << msg;
  }
}

TEST(Safetensors, CorruptFilesGiveNamedErrors) {
  std::string dir = temp_dir("st-bad");
  nn::Rng rng(1);
  io::write_safetensors(dir + "/good.safetensors", {{"w", random({4, 4}, rng)}}, {});
  std::string good = slurp(dir + "/good.safetensors");

  spit(dir + "/truncated.safetensors", good.substr(0, good.size() - 10));
  expect_error(dir + "/truncated.safetensors", "'w'");
  spit(dir + "/tiny.safetensors", good.substr(0, 5));
  expect_error(dir + "/tiny.safetensors", "8-byte header length");
  std::string huge = good;
  huge[6] = 0x7f;  // header length far beyond the file
  spit(dir + "/huge.safetensors", huge);
  expect_error(dir + "/huge.safetensors", "header length");
  spit(dir + "/json.safetensors", with_header("{\"w\": {\"dtype\": \"F32\",", 16));
  expect_error(dir + "/json.safetensors", "not valid JSON");
  spit(dir + "/lie.safetensors",
       with_header(R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,60]}})", 64));
  expect_error(dir + "/lie.safetensors", "needs 64");
  spit(dir + "/beyond.safetensors",
       with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[60,68]}})", 64));
  expect_error(dir + "/beyond.safetensors", "outside the data section");
  spit(
      dir + "/overlap.safetensors",
      with_header(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          16));
  expect_error(dir + "/overlap.safetensors", "overlap");
  spit(dir + "/dtype.safetensors",
       with_header(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8));
  expect_error(dir + "/dtype.safetensors", "Q4");
  spit(dir + "/shape.safetensors",
       with_header(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  expect_error(dir + "/shape.safetensors", "non-negative");
  expect_error(dir + "/absent.safetensors", "cannot open");
}

// Dims whose product overflows were accepted before: [2^32, 2^32] of F32 needed
// 2^66 bytes, which wrapped to 0 and matched data_offsets [0,0]; a dim of 2^63 was read as
// -2^63. Loading either then allocated from the wrapped size.
TEST(Safetensors, ShapesThatOverflowAreRefusedBeforeAnyAllocation) {
  std::string dir = temp_dir("st-overflow");
  spit(dir + "/wrap.safetensors",
       with_header(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                   0));
  expect_error(dir + "/wrap.safetensors",
               "tensor 'w': the element count of shape [4294967296,4294967296] overflows int64");
  spit(dir + "/sign.safetensors",
       with_header(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,0]}})",
                   0));
  expect_error(dir + "/sign.safetensors",
               "tensor 'w': shape [9223372036854775808] has a dimension above 2^48");
  // 2^62 F32 elements are 2^64 bytes: the byte count wrapped to 0 as well.
  spit(dir + "/bytes.safetensors",
       with_header(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
                   0));
  expect_error(dir + "/bytes.safetensors", "tensor 'w': shape [4611686018427387904]");
  // A zero dimension does not hide an overflow in the others.
  spit(dir + "/zero.safetensors",
       with_header(
           R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0));
  expect_error(dir + "/zero.safetensors", "overflows int64");
}

// Every hostile file kept in tests/fixtures/fuzz/safetensors: read, then each tensor
// loaded, gives a loom::Error naming the file; nothing else is thrown, nothing crashes.
TEST(Safetensors, FuzzFixturesGiveNamedErrors) {
  std::vector<std::string> files = fuzz_inputs("safetensors");
  EXPECT_FALSE(files.empty());
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    std::string message = error_of([&] {
      io::SafetensorsFile f = io::SafetensorsFile::read(path);
      for (const io::SafetensorsEntry& e : f.entries())
        f.load_f32(e, cpu());
    });
    // A finding on valid input (an empty tensor) loads; any error names the file.
    EXPECT_TRUE(message.empty() || message.find(path) != std::string::npos) << message;
  }
}

}  // namespace
}  // namespace loom::testing
