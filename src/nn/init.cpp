#include "nn/init.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace loom::nn {

double Rng::uniform() {
  return static_cast<double>(engine_() >> 11) * 0x1.0p-53;
}

double Rng::normal(double mean, double std) {
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300)
    u1 = 1e-300;
  return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Tensor normal_tensor(const Shape& shape, double std, Rng& rng, Backend& backend) {
  std::vector<float> values(shape_numel(shape));
  for (float& v : values)
    v = static_cast<float>(rng.normal(0.0, std));
  return Tensor::from_floats(shape, values, backend);
}

Tensor uniform_tensor(const Shape& shape, double bound, Rng& rng, Backend& backend) {
  std::vector<float> values(shape_numel(shape));
  for (float& v : values)
    v = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
  return Tensor::from_floats(shape, values, backend);
}

Tensor constant_tensor(const Shape& shape, float value, Backend& backend) {
  std::vector<float> values(shape_numel(shape), value);
  return Tensor::from_floats(shape, values, backend);
}

}  // namespace loom::nn
