// nn/init.h — seeded, platform-independent random initialisation.
#pragma once

#include <cstdint>
#include <random>

#include "core/op_catalog.h"
#include "core/tensor.h"

namespace loom::nn {

// mt19937_64 plus our own normal/uniform transforms, so a seed gives the same
// weights with every standard library.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  double uniform();                        // [0, 1)
  double normal(double mean, double std);  // Box-Muller
  std::uint64_t next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

Tensor normal_tensor(const Shape& shape, double std, Rng& rng, Backend& backend);
Tensor uniform_tensor(const Shape& shape, double bound, Rng& rng,
                      Backend& backend);  // U(-bound, bound)
Tensor constant_tensor(const Shape& shape, float value, Backend& backend);

using loom::mix_seed;  // core/op_catalog.h: (run seed, step) -> batch seed

}  // namespace loom::nn
