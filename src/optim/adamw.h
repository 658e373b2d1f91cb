// optim/adamw.h — AdamW with decoupled weight decay, global-norm gradient clipping and
// the cosine learning-rate schedule with linear warmup (nanoGPT's get_lr).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/model.h"

namespace loom::optim {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(std::vector<nn::Parameter>& params, const AdamWConfig& config);
  // One update with learning rate `lr`; the step counter (for bias correction) advances.
  void step(double lr);
  void zero_grad();
  std::int64_t steps_taken() const { return step_; }
  void set_steps_taken(std::int64_t step) { step_ = step; }
  // First and second moments, one pair per parameter, in parameter order (checkpoints).
  std::vector<Tensor>& first_moments() { return m_; }
  std::vector<Tensor>& second_moments() { return v_; }
  // Sharded optimizer state (ZeRO stage 1): only parameters with owned[i] are updated, and
  // the moments of the others are released. Restore the moments (e.g. gathered for a
  // checkpoint) with first_moments()/second_moments() before calling it again.
  void keep_only(const std::vector<bool>& owned);

 private:
  std::vector<nn::Parameter>& params_;
  AdamWConfig config_;
  std::vector<Tensor> m_, v_;
  std::vector<bool> owned_;  // empty: every parameter
  std::int64_t step_ = 0;
};

// Scales all gradients by max_norm / norm when their global L2 norm exceeds max_norm.
// Returns the norm before clipping. Parameters without a gradient are skipped.
double clip_grad_norm(std::vector<nn::Parameter>& params, double max_norm);

// The two halves of clip_grad_norm, for norms that span processes (pipeline stages):
// `counted(i)` picks the parameters to include (empty: every one with a gradient).
using ParameterFilter = std::function<bool(std::size_t index)>;
// Sum of the squares of the gradients, summed on the device and read once (one host
// synchronisation per step instead of one per parameter, each a full stall on a GPU).
float grad_sum_squares(const std::vector<nn::Parameter>& params,
                       const ParameterFilter& counted = {});
// Scales the gradients by max_norm / (norm + 1e-6) when norm > max_norm, as
// torch.nn.utils.clip_grad_norm_.
void scale_grads_to_norm(std::vector<nn::Parameter>& params, double norm, double max_norm,
                         const ParameterFilter& counted = {});

// lr(it): linear warmup over `warmup` steps to `max_lr`, then cosine decay to `min_lr` at
// `decay_steps`, constant after (nanoGPT's schedule, same formula).
double cosine_lr(std::int64_t it, double max_lr, double min_lr, std::int64_t warmup,
                 std::int64_t decay_steps);

}  // namespace loom::optim
