#include "nn/gpt.h"

#include <cmath>

#include "autograd/functions.h"
#include "core/error.h"

namespace loom::nn {

namespace ag = loom::autograd;

void GptConfig::validate() const {
  auto positive = [](const char* field, std::int64_t value) {
    check(value > 0, std::string(field) + " = " + std::to_string(value) + ", expected > 0");
  };
  positive("vocab", vocab);
  positive("context", context);
  positive("layers", layers);
  positive("heads", heads);
  positive("width", width);
  check(width % heads == 0, "width = " + std::to_string(width) +
                                " is not divisible by heads = " + std::to_string(heads));
  check(dropout >= 0.0 && dropout < 1.0,
        "dropout = " + std::to_string(dropout) + ", expected 0 <= dropout < 1");
}

Gpt::Gpt(const GptConfig& config, std::uint64_t seed, Backend& backend) : config_(config) {
  config.validate();
  Rng rng(seed);
  const std::int64_t c = config.width;
  const double std_dev = 0.02;
  // GPT-2 scales the residual projections by 1/sqrt(2 * layers) (two per block).
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  auto add = [&](const std::string& name, Tensor value, bool decay, bool trained = true) {
    params_.push_back({name, ag::Var(std::move(value), trained), decay});
    return params_.size() - 1;
  };
  // A (weight, bias) pair; returns the weight's index, the bias follows it.
  auto add_pair = [&](const std::string& name, Tensor weight, Tensor bias, bool decay_weight) {
    std::size_t w = add(name + ".weight", std::move(weight), decay_weight);
    add(name + ".bias", std::move(bias), false, config.bias);
    return w;
  };
  wte_ =
      add("transformer.wte.weight", normal_tensor({config.vocab, c}, std_dev, rng, backend), true);
  wpe_ = add("transformer.wpe.weight", normal_tensor({config.context, c}, std_dev, rng, backend),
             true);
  for (std::int64_t i = 0; i < config.layers; ++i) {
    std::string h = "transformer.h." + std::to_string(i);
    Block b{};
    b.ln1 = add_pair(h + ".ln_1", constant_tensor({c}, 1.0f, backend),
                     constant_tensor({c}, 0.0f, backend), false);
    b.attn = add_pair(h + ".attn.c_attn", normal_tensor({c, 3 * c}, std_dev, rng, backend),
                      constant_tensor({3 * c}, 0.0f, backend), true);
    b.attn_proj = add_pair(h + ".attn.c_proj", normal_tensor({c, c}, proj_std, rng, backend),
                           constant_tensor({c}, 0.0f, backend), true);
    b.ln2 = add_pair(h + ".ln_2", constant_tensor({c}, 1.0f, backend),
                     constant_tensor({c}, 0.0f, backend), false);
    b.fc = add_pair(h + ".mlp.c_fc", normal_tensor({c, 4 * c}, std_dev, rng, backend),
                    constant_tensor({4 * c}, 0.0f, backend), true);
    b.proj = add_pair(h + ".mlp.c_proj", normal_tensor({4 * c, c}, proj_std, rng, backend),
                      constant_tensor({c}, 0.0f, backend), true);
    blocks_.push_back(b);
  }
  ln_f_ = add_pair("transformer.ln_f", constant_tensor({c}, 1.0f, backend),
                   constant_tensor({c}, 0.0f, backend), false);
}

ag::Var Gpt::forward(ag::Tape& tape, const Tensor& ids, const ForwardOptions& options) {
  ag::Var x = embed(tape, ids, options);
  x = run_blocks(tape, x, 0, config_.layers, options);
  return head(tape, x);
}

// Dropout sites are numbered through the whole model (1: embeddings; 2 + 2i and 3 + 2i:
// block i's two residual branches), so a model run in pieces (pipeline stages) draws
// exactly the masks the whole model draws.
ag::Var Gpt::embed(ag::Tape& tape, const Tensor& ids, const ForwardOptions& options) {
  check(ids.dtype() == DType::i32 && ids.rank() == 2,
        "gpt: token ids " + ids.describe() + " must be i32 [B,T]");
  const std::int64_t t = ids.dim(1);
  check(t <= config_.context, "gpt: sequence length " + std::to_string(t) +
                                  " exceeds context = " + std::to_string(config_.context));
  ag::Var x =
      ag::add(tape, ag::embedding(tape, param(wte_), ids), ag::slice(tape, param(wpe_), 0, 0, t));
  return dropout(tape, x, options, 1);
}

ag::Var Gpt::run_blocks(ag::Tape& tape, ag::Var x, std::int64_t first, std::int64_t last,
                        const ForwardOptions& options) {
  check(0 <= first && first <= last && last <= config_.layers,
        "gpt: blocks [" + std::to_string(first) + ", " + std::to_string(last) + ") of " +
            std::to_string(config_.layers));
  for (std::int64_t i = first; i < last; ++i) {
    const Block& blk = blocks_[static_cast<std::size_t>(i)];
    ag::Var h = ag::layer_norm(tape, x, param(blk.ln1), param(blk.ln1 + 1));
    h = ag::linear(tape, h, param(blk.attn), param(blk.attn + 1));  // [B,T,3C]
    h = ag::causal_attention(tape, h, config_.heads);               // [B,T,C]
    h = dropout(tape, ag::linear(tape, h, param(blk.attn_proj), param(blk.attn_proj + 1)), options,
                static_cast<std::uint64_t>(2 + 2 * i));
    x = ag::add(tape, x, h);
    h = ag::layer_norm(tape, x, param(blk.ln2), param(blk.ln2 + 1));
    h = ag::gelu(tape, ag::linear(tape, h, param(blk.fc), param(blk.fc + 1)));  // [B,T,4C]
    h = dropout(tape, ag::linear(tape, h, param(blk.proj), param(blk.proj + 1)), options,
                static_cast<std::uint64_t>(3 + 2 * i));
    x = ag::add(tape, x, h);
  }
  return x;
}

ag::Var Gpt::head(ag::Tape& tape, const ag::Var& x_in) {
  const std::int64_t c = config_.width;
  ag::Var x = ag::layer_norm(tape, x_in, param(ln_f_), param(ln_f_ + 1));
  x = ag::reshape(tape, x, {x_in.value().numel() / c, c});
  return ag::matmul(tape, x, param(wte_), false, true);  // tied LM head: logits = x wte^T
}

ag::Var Gpt::dropout(ag::Tape& tape, const ag::Var& x, const ForwardOptions& options,
                     std::uint64_t site) {
  const double p = options.training ? config_.dropout : 0.0;
  return ag::dropout(tape, x, p, options.dropout_seed, site);
}

std::vector<std::size_t> Gpt::parameter_indices(std::int64_t first, std::int64_t last,
                                                bool embeddings, bool with_head) const {
  std::vector<std::size_t> out;
  auto pair = [&](std::size_t weight) {  // a weight and the bias after it
    out.push_back(weight);
    out.push_back(weight + 1);
  };
  if (embeddings) {
    out.push_back(wte_);
    out.push_back(wpe_);
  }
  for (std::int64_t i = first; i < last; ++i) {
    const Block& b = blocks_[static_cast<std::size_t>(i)];
    for (std::size_t w : {b.ln1, b.attn, b.attn_proj, b.ln2, b.fc, b.proj})
      pair(w);
  }
  if (with_head) {
    if (!embeddings)
      out.push_back(wte_);  // the tied LM head
    pair(ln_f_);
  }
  return out;
}

}  // namespace loom::nn
