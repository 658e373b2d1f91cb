// The decoder's gpt2 configuration (Loom's `gpt`): GPT-2 exactly as Hugging Face defines it.
// Learned token and position embeddings, pre-LN blocks, one fused q/k/v projection, causal
// self-attention, a tanh-approximated GELU MLP, a final LayerNorm and an LM head tied to the
// token embedding. Conv1D layouts ([in, out]) under GPT-2's names, so checkpoints load into
// transformers' GPT2LMHeadModel.
#include <cmath>

#include "autograd/functions.h"
#include "core/error.h"
#include "nn/decoder.h"

namespace loom::nn {

namespace ag = loom::autograd;

void Decoder::build_gpt2(Rng& rng, Backend& backend) {
  const DecoderConfig& config = config_;
  const std::int64_t c = config.hidden, f = config.intermediate;
  const double std_dev = config.init_std;
  // GPT-2 scales the residual projections by 1/sqrt(2 * layers) (two per block).
  const double proj_std = std_dev / std::sqrt(2.0 * static_cast<double>(config.layers));
  auto add = [&](const std::string& name, Tensor value, bool decay, bool trained = true) {
    params_.push_back({name, ag::Var(std::move(value), trained), decay});
    return params_.size() - 1;
  };
  // A (weight, bias) pair; returns the weight's index, the bias follows it.
  auto add_pair = [&](const std::string& name, Tensor weight, Tensor bias, bool decay_weight) {
    std::size_t w = add(name + ".weight", std::move(weight), decay_weight);
    add(name + ".bias", std::move(bias), false, config.train_biases);
    return w;
  };
  auto norm = [&](const std::string& name) {
    return add_pair(name, constant_tensor({c}, 1.0f, backend), constant_tensor({c}, 0.0f, backend),
                    false);
  };
  auto conv1d = [&](const std::string& name, std::int64_t in, std::int64_t out, double sd) {
    return add_pair(name, normal_tensor({in, out}, sd, rng, backend),
                    constant_tensor({out}, 0.0f, backend), true);
  };
  embed_ =
      add("transformer.wte.weight", normal_tensor({config.vocab, c}, std_dev, rng, backend), true);
  positions_ = add("transformer.wpe.weight",
                   normal_tensor({config.context, c}, std_dev, rng, backend), true);
  for (std::int64_t i = 0; i < config.layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i);
    Block b{};
    b.input_norm = norm(h + ".ln_1");
    b.q = conv1d(h + ".attn.c_attn", c, 3 * c, std_dev);
    b.o = conv1d(h + ".attn.c_proj", c, c, proj_std);
    b.post_norm = norm(h + ".ln_2");
    b.up = conv1d(h + ".mlp.c_fc", c, f, std_dev);
    b.down = conv1d(h + ".mlp.c_proj", f, c, proj_std);
    blocks_.push_back(b);
  }
  final_norm_ = norm("transformer.ln_f");
  lm_head_ = embed_;  // tied
}

// Dropout sites are numbered through the whole model (1: embeddings; 2 + 2i and 3 + 2i:
// block i's two residual branches), so a model run in pieces (pipeline stages) draws
// exactly the masks the whole model draws.
ag::Var Decoder::gpt2_embed(ag::Tape& tape, const Tensor& ids, std::int64_t position,
                            const ForwardOptions& options) {
  check(ids.dtype() == DType::i32 && ids.rank() == 2,
        "gpt: token ids " + ids.describe() + " must be i32 [B,T]");
  const std::int64_t end = position + ids.dim(1);
  check(end <= config_.context, "gpt: sequence length " + std::to_string(end) +
                                    " exceeds context = " + std::to_string(config_.context));
  ag::Var x = ag::add(tape, ag::embedding(tape, param(embed_), ids),
                      ag::slice(tape, param(positions_), 0, position, end));
  return dropout(tape, x, options, 1);
}

ag::Var Decoder::gpt2_blocks(ag::Tape& tape, ag::Var x, std::int64_t first, std::int64_t last,
                             KvCache* cache, const ForwardOptions& options) {
  check(0 <= first && first <= last && last <= config_.layers,
        "gpt: blocks [" + std::to_string(first) + ", " + std::to_string(last) + ") of " +
            std::to_string(config_.layers));
  const double eps = config_.norm_eps;
  const std::int64_t c = config_.hidden, heads = config_.heads, d = config_.head_dim;
  for (std::int64_t i = first; i < last; ++i) {
    const Block& blk = blocks_[static_cast<std::size_t>(i)];
    ag::Var h = ag::layer_norm(tape, x, param(blk.input_norm), param(blk.input_norm + 1), eps);
    h = ag::linear(tape, h, param(blk.q), param(blk.q + 1));  // [B,T,3C]: q, k, v
    if (cache == nullptr) {
      h = ag::causal_attention(tape, h, heads);  // [B,T,C]
    } else {                                     // the cached positions' keys and values come first
      const std::int64_t batch = h.dim(0), t = h.dim(1);
      auto part = [&](std::int64_t k) {
        return ag::reshape(tape, ag::slice(tape, h, 2, k * c, (k + 1) * c), {batch, t, heads, d});
      };
      ag::Var q = part(0), key = part(1), value = part(2);
      Tensor& keys = cache->keys[static_cast<std::size_t>(i)];
      Tensor& values = cache->values[static_cast<std::size_t>(i)];
      if (keys.defined()) {
        key = ag::concat(tape, {ag::Var(keys, false), key}, 1);
        value = ag::concat(tape, {ag::Var(values, false), value}, 1);
      }
      keys = key.value();
      values = value.value();
      h = ag::reshape(tape, ag::attention(tape, q, key, value), {batch, t, c});
    }
    h = dropout(tape, ag::linear(tape, h, param(blk.o), param(blk.o + 1)), options,
                static_cast<std::uint64_t>(2 + 2 * i));
    x = ag::add(tape, x, h);
    h = ag::layer_norm(tape, x, param(blk.post_norm), param(blk.post_norm + 1), eps);
    h = ag::gelu(tape, ag::linear(tape, h, param(blk.up), param(blk.up + 1)));  // [B,T,F]
    h = dropout(tape, ag::linear(tape, h, param(blk.down), param(blk.down + 1)), options,
                static_cast<std::uint64_t>(3 + 2 * i));
    x = ag::add(tape, x, h);
  }
  return x;
}

ag::Var Decoder::gpt2_head(ag::Tape& tape, const ag::Var& x_in) {
  const std::int64_t c = config_.hidden;
  ag::Var x =
      ag::layer_norm(tape, x_in, param(final_norm_), param(final_norm_ + 1), config_.norm_eps);
  x = ag::reshape(tape, x, {x_in.value().numel() / c, c});
  return ag::matmul(tape, x, param(lm_head_), false, true);  // tied LM head: logits = x wte^T
}

ag::Var Decoder::dropout(ag::Tape& tape, const ag::Var& x, const ForwardOptions& options,
                         std::uint64_t site) {
  const double p = options.training ? config_.dropout : 0.0;
  return ag::dropout(tape, x, p, options.dropout_seed, site);
}

}  // namespace loom::nn
