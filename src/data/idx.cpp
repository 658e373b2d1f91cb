#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <memory>

#include "core/checked.h"
#include "core/error.h"

namespace loom::data {
namespace {

// Reads a whole file through zlib, which passes plain files through unchanged.
std::vector<unsigned char> read_maybe_gzip(const std::string& path) {
  struct Closer {
    void operator()(gzFile_s* f) const { gzclose(f); }
  };
  std::unique_ptr<gzFile_s, Closer> file(gzopen(path.c_str(), "rb"));
  check(file != nullptr, path + ": cannot open (missing or unreadable)");
  std::vector<unsigned char> out;
  unsigned char chunk[1 << 16];
  for (;;) {
    int n = gzread(file.get(), chunk, sizeof chunk);
    check(n >= 0, path + ": corrupt gzip data");
    if (n == 0)
      break;
    out.insert(out.end(), chunk, chunk + n);
  }
  return out;
}

// The largest image side an IDX file may declare (MNIST's is 28): rows x cols stays within
// 2^32, and only the count x pixels product can overflow, which is checked.
constexpr std::int64_t kMaxSide = 65536;

std::uint32_t be32(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

}  // namespace

ImageSet load_idx(const std::string& images_path, const std::string& labels_path) {
  std::vector<unsigned char> img = read_maybe_gzip(images_path);
  std::vector<unsigned char> lab = read_maybe_gzip(labels_path);
  check(img.size() >= 16, images_path + ": " + std::to_string(img.size()) +
                              " bytes; an IDX image file has a 16-byte header");
  check(lab.size() >= 8, labels_path + ": " + std::to_string(lab.size()) +
                             " bytes; an IDX label file has an 8-byte header");
  check(be32(img, 0) == 0x803, images_path + ": magic = " + std::to_string(be32(img, 0)) +
                                   ", expected 2051 (u8 images, 3 dims)");
  check(be32(lab, 0) == 0x801, labels_path + ": magic = " + std::to_string(be32(lab, 0)) +
                                   ", expected 2049 (u8 labels, 1 dim)");
  ImageSet set;
  set.count = be32(img, 4);
  set.rows = be32(img, 8);
  set.cols = be32(img, 12);
  // Three u32 fields multiply to up to 2^96, which wrapped to the size of a tiny file: the
  // sides are bounded and the product is checked.
  for (auto [field, value] : {std::pair{"rows", set.rows}, std::pair{"cols", set.cols}})
    check(value >= 1 && value <= kMaxSide, images_path + ": " + field + " = " +
                                               std::to_string(value) + ", expected 1.." +
                                               std::to_string(kMaxSide));
  const std::int64_t pixels =
      checked_mul(set.count, set.rows * set.cols,
                  images_path + ": header count " + std::to_string(set.count) + " x rows " +
                      std::to_string(set.rows) + " x cols " + std::to_string(set.cols));
  check(static_cast<std::int64_t>(img.size()) - 16 == pixels,
        images_path + ": " + std::to_string(img.size()) + " bytes, header promises " +
            std::to_string(set.count) + " x " + std::to_string(set.rows) + " x " +
            std::to_string(set.cols) + " = " + std::to_string(pixels) +
            " pixels after the 16-byte header");
  std::int64_t label_count = be32(lab, 4);
  check(label_count == set.count, labels_path + ": count = " + std::to_string(label_count) +
                                      ", but " + images_path + " holds " +
                                      std::to_string(set.count) + " images");
  check(static_cast<std::int64_t>(lab.size()) == 8 + label_count,
        labels_path + ": " + std::to_string(lab.size()) + " bytes, header promises " +
            std::to_string(8 + label_count));
  set.pixels.resize(img.size() - 16);
  for (std::size_t i = 0; i < set.pixels.size(); ++i)
    set.pixels[i] = static_cast<float>(img[16 + i]) / 255.0f;
  set.labels.resize(label_count);
  for (std::int64_t i = 0; i < label_count; ++i) {
    set.labels[i] = lab[8 + i];
    check(set.labels[i] <= 9, labels_path + ": label " + std::to_string(set.labels[i]) +
                                  " at index " + std::to_string(i) + ", expected 0..9");
  }
  return set;
}

void normalize_mnist(ImageSet& set) {
  for (float& p : set.pixels)
    p = (p - 0.1307f) / 0.3081f;
}

Batch image_batch(const ImageSet& set, const std::vector<std::int64_t>& order, std::int64_t first,
                  std::int64_t n, Backend& backend) {
  std::int64_t pixels = set.rows * set.cols;
  std::vector<float> x(n * pixels);
  std::vector<std::int32_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t sample = order[first + i];
    std::copy_n(set.pixels.begin() + sample * pixels, pixels, x.begin() + i * pixels);
    y[i] = set.labels[sample];
  }
  return {Tensor::from_floats({n, 1, set.rows, set.cols}, x, backend),
          Tensor::from_ints({n}, y, backend)};
}

}  // namespace loom::data
