// data/idx.h — IDX files (MNIST's format), plain or gzip-compressed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/text.h"

namespace loom::data {

struct ImageSet {
  std::int64_t count = 0, rows = 0, cols = 0;
  std::vector<float> pixels;         // count * rows * cols, scaled to [0, 1]
  std::vector<std::int32_t> labels;  // count
};

// Loads an images file (magic 0x803) and its labels file (magic 0x801); throws naming
// the file, the field and the value on a bad magic, size or count mismatch.
ImageSet load_idx(const std::string& images_path, const std::string& labels_path);

// MNIST's normalisation: (x - 0.1307) / 0.3081, as torchvision's examples.
void normalize_mnist(ImageSet& set);

// Images [n,1,rows,cols] and labels [n] for the samples order[first, first+n).
Batch image_batch(const ImageSet& set, const std::vector<std::int64_t>& order, std::int64_t first,
                  std::int64_t n, Backend& backend);

}  // namespace loom::data
