#include "optim/adamw.h"

#include <array>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "dispatch/dispatch.h"

namespace loom::optim {

AdamW::AdamW(std::vector<nn::Parameter>& params, const AdamWConfig& config)
    : params_(params), config_(config) {
  for (const nn::Parameter& p : params_) {
    Attrs zeros;
    zeros.shape = p.var.shape();
    zeros.alpha = 0.0;
    Backend* device = &p.var.value().backend();
    m_.push_back(dispatch::call(OpId::fill, {}, zeros, device).front());
    v_.push_back(dispatch::call(OpId::fill, {}, zeros, device).front());
  }
}

void AdamW::step(double lr) {
  ++step_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = params_[i];
    if (!p.var.grad().defined() || (!owned_.empty() && !owned_[i]))
      continue;
    Attrs a;
    a.lr = lr;
    a.beta1 = config_.beta1;
    a.beta2 = config_.beta2;
    a.eps = config_.eps;
    a.weight_decay = p.weight_decay ? config_.weight_decay : 0.0;
    a.step = step_;
    Tensor param = p.var.value();
    std::array<Tensor, 4> inputs{param, p.var.grad(), m_[i], v_[i]};
    std::array<Tensor, 3> outputs{param, m_[i], v_[i]};
    dispatch::call_into(OpId::adamw_step, inputs, outputs, a);
  }
}

void AdamW::keep_only(const std::vector<bool>& owned) {
  check(owned.size() == params_.size(), [&] {
    return "AdamW::keep_only: " + std::to_string(owned.size()) + " flags for " +
           std::to_string(params_.size()) + " parameters";
  });
  owned_ = owned;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (owned_[i])
      continue;
    m_[i] = Tensor();
    v_[i] = Tensor();
  }
}

void AdamW::zero_grad() {
  for (nn::Parameter& p : params_)
    p.var.zero_grad();
}

float grad_sum_squares(const std::vector<nn::Parameter>& params, const ParameterFilter& counted) {
  Tensor total;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& grad = params[i].var.grad();
    if (!grad.defined() || (counted && !counted(i)))
      continue;
    Tensor squares = dispatch::call1(OpId::sum_squares, {grad});
    total = total.defined() ? dispatch::call1(OpId::add, {total, squares}) : squares;
  }
  return total.defined() ? total.item() : 0.0f;
}

void scale_grads_to_norm(std::vector<nn::Parameter>& params, double norm, double max_norm,
                         const ParameterFilter& counted) {
  if (!(norm > max_norm && norm > 0.0))
    return;
  Attrs a;
  a.alpha = max_norm / (norm + 1e-6);
  for (std::size_t i = 0; i < params.size(); ++i) {
    nn::Parameter& p = params[i];
    if (!p.var.grad().defined() || (counted && !counted(i)))
      continue;
    p.var.state()->grad = dispatch::call1(OpId::scale, {p.var.grad()}, a);
  }
}

double clip_grad_norm(std::vector<nn::Parameter>& params, double max_norm) {
  double norm = std::sqrt(static_cast<double>(grad_sum_squares(params)));
  scale_grads_to_norm(params, norm, max_norm);
  return norm;
}

double cosine_lr(std::int64_t it, double max_lr, double min_lr, std::int64_t warmup,
                 std::int64_t decay_steps) {
  if (it < warmup)
    return max_lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_steps)
    return min_lr;
  double ratio = static_cast<double>(it - warmup) /
                 static_cast<double>(std::max<std::int64_t>(decay_steps - warmup, 1));
  double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace loom::optim
