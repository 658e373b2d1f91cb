#include "nn/decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "autograd/functions.h"
#include "core/error.h"

namespace loom::nn {

namespace ag = loom::autograd;

namespace {
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
}

void DecoderConfig::validate() const {
  check(is_decoder_family(family) || gpt2(),
        "decoder: family '" + family + "' is not one of llama, mistral, qwen2, qwen3, gpt2");
  auto positive = [](const char* field, std::int64_t value) {
    check(value > 0, std::string(field) + " = " + std::to_string(value) + ", expected > 0");
  };
  positive("vocab_size", vocab);
  positive("hidden_size", hidden);
  positive("intermediate_size", intermediate);
  positive("num_hidden_layers", layers);
  positive("num_attention_heads", heads);
  positive("num_key_value_heads", kv_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", context);
  check(heads % kv_heads == 0,
        "num_attention_heads = " + std::to_string(heads) +
            " is not a multiple of num_key_value_heads = " + std::to_string(kv_heads));
  if (gpt2()) {  // one fused projection makes q, k and v of every head from the hidden state
    check(heads * head_dim == hidden && kv_heads == heads,
          "gpt2: hidden_size = " + std::to_string(hidden) +
              " is not divisible by heads = " + std::to_string(heads));
    check(dropout >= 0.0 && dropout < 1.0,
          "dropout = " + std::to_string(dropout) + ", expected 0 <= dropout < 1");
  } else {
    check(head_dim % 2 == 0,
          "head_dim = " + std::to_string(head_dim) + ", expected an even number (rotary pairs)");
  }
  check(norm_eps > 0, "rms_norm_eps = " + std::to_string(norm_eps) + ", expected > 0");
  check(rope_theta > 0, "rope_theta = " + std::to_string(rope_theta) + ", expected > 0");
  check(rope_scaling == RopeScaling::none || rope_factor >= 1.0,
        "rope_scaling factor = " + std::to_string(rope_factor) + ", expected >= 1");
  check(rope_scaling != RopeScaling::llama3 ||
            (rope_high_freq_factor > rope_low_freq_factor && rope_low_freq_factor > 0 &&
             rope_original_context > 0),
        "rope_scaling (llama3): expected high_freq_factor > low_freq_factor > 0 and "
        "original_max_position_embeddings > 0");
  check(init_std > 0, "initializer_range = " + std::to_string(init_std) + ", expected > 0");
}

std::vector<float> rope_inverse_frequencies(const DecoderConfig& c) {
  const float dim = static_cast<float>(c.head_dim);
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> inv(static_cast<std::size_t>(c.head_dim / 2));
  for (std::size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / dim);
  const float factor = static_cast<float>(c.rope_factor);
  if (c.rope_scaling == RopeScaling::linear) {
    for (float& f : inv)
      f /= factor;
  } else if (c.rope_scaling == RopeScaling::llama3) {
    // Llama 3.1: wavelengths longer than original/low_freq_factor are slowed by `factor`,
    // shorter than original/high_freq_factor kept, and those between blended smoothly.
    const float old_context = static_cast<float>(c.rope_original_context);
    const float low = static_cast<float>(c.rope_low_freq_factor);
    const float high = static_cast<float>(c.rope_high_freq_factor);
    const float low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
    for (float& f : inv) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (old_context / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen))
        scaled = smoothed;
      f = scaled;
    }
  }
  return inv;
}

Decoder::Decoder(const DecoderConfig& config, std::uint64_t seed, Backend& backend)
    : config_(config) {
  config.validate();
  Rng rng(seed);
  if (config.gpt2())
    build_gpt2(rng, backend);
  else
    build_llama(rng, backend);
}

void Decoder::build_llama(Rng& rng, Backend& backend) {
  const DecoderConfig& config = config_;
  const std::int64_t c = config.hidden, d = config.head_dim, f = config.intermediate;
  const std::int64_t q_width = config.heads * d, kv_width = config.kv_heads * d;
  auto add = [&](const std::string& name, Tensor value, bool decay) {
    params_.push_back({name, ag::Var(std::move(value), true), decay});
    return params_.size() - 1;
  };
  auto matrix = [&](const std::string& name, std::int64_t out, std::int64_t in) {
    return add(name + ".weight", normal_tensor({out, in}, config.init_std, rng, backend), true);
  };
  auto bias = [&](bool present, const std::string& name, std::int64_t n) {
    return present ? add(name + ".bias", constant_tensor({n}, 0.0f, backend), false) : kNone;
  };
  auto norm = [&](const std::string& name, std::int64_t n) {
    return add(name + ".weight", constant_tensor({n}, 1.0f, backend), false);
  };
  embed_ = matrix("model.embed_tokens", config.vocab, c);
  for (std::int64_t i = 0; i < config.layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i);
    Block b{};
    b.input_norm = norm(h + ".input_layernorm", c);
    b.q = matrix(h + ".self_attn.q_proj", q_width, c);
    b.q_bias = bias(config.qkv_bias, h + ".self_attn.q_proj", q_width);
    b.k = matrix(h + ".self_attn.k_proj", kv_width, c);
    b.k_bias = bias(config.qkv_bias, h + ".self_attn.k_proj", kv_width);
    b.v = matrix(h + ".self_attn.v_proj", kv_width, c);
    b.v_bias = bias(config.qkv_bias, h + ".self_attn.v_proj", kv_width);
    b.o = matrix(h + ".self_attn.o_proj", c, q_width);
    b.o_bias = bias(config.o_bias, h + ".self_attn.o_proj", c);
    b.q_norm = config.qk_norm ? norm(h + ".self_attn.q_norm", d) : kNone;
    b.k_norm = config.qk_norm ? norm(h + ".self_attn.k_norm", d) : kNone;
    b.post_norm = norm(h + ".post_attention_layernorm", c);
    b.gate = matrix(h + ".mlp.gate_proj", f, c);
    b.gate_bias = bias(config.mlp_bias, h + ".mlp.gate_proj", f);
    b.up = matrix(h + ".mlp.up_proj", f, c);
    b.up_bias = bias(config.mlp_bias, h + ".mlp.up_proj", f);
    b.down = matrix(h + ".mlp.down_proj", c, f);
    b.down_bias = bias(config.mlp_bias, h + ".mlp.down_proj", c);
    blocks_.push_back(b);
  }
  final_norm_ = norm("model.norm", c);
  lm_head_ = config.tie_embeddings ? embed_ : matrix("lm_head", config.vocab, c);

  // cos and sin of t * frequency[i], the angle's product rounded to f32 as transformers
  // forms it (inv_freq @ position in f32), then the functions taken of that f32 angle.
  const std::vector<float> inv = rope_inverse_frequencies(config);
  const std::int64_t half = d / 2;
  std::vector<float> cos_v, sin_v, neg_sin_v;
  for (std::int64_t t = 0; t < config.context; ++t) {
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv[static_cast<std::size_t>(i)];
      cos_v.push_back(static_cast<float>(std::cos(static_cast<double>(angle))));
      sin_v.push_back(static_cast<float>(std::sin(static_cast<double>(angle))));
      neg_sin_v.push_back(-sin_v.back());
    }
  }
  cos_ = Tensor::from_floats({config.context, half}, cos_v, backend);
  sin_ = Tensor::from_floats({config.context, half}, sin_v, backend);
  neg_sin_ = Tensor::from_floats({config.context, half}, neg_sin_v, backend);
}

ag::Var Decoder::project(ag::Tape& tape, const ag::Var& x, std::size_t weight, std::size_t bias) {
  if (bias == kNone)
    return ag::matmul(tape, x, param(weight), false, true);
  return ag::linear(tape, x, param(weight), param(bias), true);
}

// x [B*T, C] -> the attention branch [B*T, C], for positions [position, position + t).
ag::Var Decoder::attention_block(ag::Tape& tape, const ag::Var& x, const Block& b,
                                 std::int64_t batch, std::int64_t t, std::int64_t position,
                                 Tensor* cached_keys, Tensor* cached_values) {
  const std::int64_t d = config_.head_dim;
  ag::Var h = ag::rms_norm(tape, x, param(b.input_norm), config_.norm_eps);
  ag::Var q = ag::reshape(tape, project(tape, h, b.q, b.q_bias), {batch, t, config_.heads, d});
  ag::Var k = ag::reshape(tape, project(tape, h, b.k, b.k_bias), {batch, t, config_.kv_heads, d});
  ag::Var v = ag::reshape(tape, project(tape, h, b.v, b.v_bias), {batch, t, config_.kv_heads, d});
  if (config_.qk_norm) {
    q = ag::rms_norm(tape, q, param(b.q_norm), config_.norm_eps);
    k = ag::rms_norm(tape, k, param(b.k_norm), config_.norm_eps);
  }
  const std::int64_t end = position + t;
  Tensor cos = cos_.slice(0, position, end), sin = sin_.slice(0, position, end),
         neg_sin = neg_sin_.slice(0, position, end);
  q = ag::rope(tape, q, cos, sin, neg_sin);
  k = ag::rope(tape, k, cos, sin, neg_sin);
  if (cached_keys != nullptr) {  // the earlier positions' keys and values come first
    if (cached_keys->defined()) {
      k = ag::concat(tape, {ag::Var(*cached_keys, false), k}, 1);
      v = ag::concat(tape, {ag::Var(*cached_values, false), v}, 1);
    }
    *cached_keys = k.value();
    *cached_values = v.value();
  }
  ag::Var a = ag::reshape(tape, ag::attention(tape, q, k, v), {batch * t, config_.heads * d});
  return project(tape, a, b.o, b.o_bias);
}

ag::Var Decoder::mlp_block(ag::Tape& tape, const ag::Var& x, const Block& b) {
  ag::Var h = ag::rms_norm(tape, x, param(b.post_norm), config_.norm_eps);
  ag::Var gated =
      ag::swiglu(tape, project(tape, h, b.gate, b.gate_bias), project(tape, h, b.up, b.up_bias));
  return project(tape, gated, b.down, b.down_bias);
}

ag::Var Decoder::forward(ag::Tape& tape, const Tensor& ids, const ForwardOptions& options) {
  return run(tape, ids, 0, nullptr, options);
}

Tensor Decoder::decode(const Tensor& ids, KvCache& cache) {
  if (cache.length == 0) {
    cache.keys.assign(blocks_.size(), Tensor());
    cache.values.assign(blocks_.size(), Tensor());
  }
  ag::Tape tape;
  tape.set_recording(false);
  Tensor logits = run(tape, ids, cache.length, &cache, {}).value();
  cache.length += ids.dim(1);
  return logits;
}

ag::Var Decoder::run(ag::Tape& tape, const Tensor& ids, std::int64_t position, KvCache* cache,
                     const ForwardOptions& options) {
  if (config_.gpt2())
    return gpt2_head(tape, gpt2_blocks(tape, gpt2_embed(tape, ids, position, options), 0,
                                       config_.layers, cache, options));
  const std::int64_t rows = ids.dim(0) * ids.dim(1);  // the stream as rows [B*T, C]
  ag::Var x = ag::reshape(tape, llama_embed(tape, ids, position), {rows, config_.hidden});
  return llama_head(
      tape, llama_blocks(tape, x, 0, config_.layers, ids.dim(0), ids.dim(1), position, cache));
}

ag::Var Decoder::llama_embed(ag::Tape& tape, const Tensor& ids, std::int64_t position) {
  check(ids.dtype() == DType::i32 && ids.rank() == 2,
        config_.family + ": token ids " + ids.describe() + " must be i32 [B,T]");
  const std::int64_t end = position + ids.dim(1);
  check(end <= config_.context,
        config_.family + ": position " + std::to_string(end) +
            " exceeds max_position_embeddings = " + std::to_string(config_.context));
  check(config_.sliding_window == 0 || end <= config_.sliding_window,
        config_.family + ": sequence length " + std::to_string(end) +
            " exceeds sliding_window = " + std::to_string(config_.sliding_window) +
            " (windowed attention is not implemented; every position here sees all before it)");
  return ag::embedding(tape, param(embed_), ids);  // [B, T, C]
}

ag::Var Decoder::llama_blocks(ag::Tape& tape, ag::Var x, std::int64_t first, std::int64_t last,
                              std::int64_t batch, std::int64_t t, std::int64_t position,
                              KvCache* cache) {
  check(0 <= first && first <= last && last <= config_.layers,
        config_.family + ": blocks [" + std::to_string(first) + ", " + std::to_string(last) +
            ") of " + std::to_string(config_.layers));
  // x: the residual stream as rows [B*T, C] (under sequence parallelism a rank holds some of
  // them: B and T are the whole sizes); only attention needs the [B,T,heads,D] view.
  for (std::int64_t i = first; i < last; ++i) {
    const Block& b = blocks_[static_cast<std::size_t>(i)];
    const std::size_t layer = static_cast<std::size_t>(i);
    x = ag::add(tape, x,
                attention_block(tape, x, b, batch, t, position,
                                cache != nullptr ? &cache->keys[layer] : nullptr,
                                cache != nullptr ? &cache->values[layer] : nullptr));
    x = ag::add(tape, x, mlp_block(tape, x, b));
  }
  return x;
}

ag::Var Decoder::llama_head(ag::Tape& tape, const ag::Var& x) {
  ag::Var h = ag::rms_norm(tape, x, param(final_norm_), config_.norm_eps);
  return ag::matmul(tape, h, param(lm_head_), false, true);  // logits = x W^T
}

// The pieces pipeline stages run: forward = head(run_blocks(embed)), the same ops in the
// same order as the whole model's, so a model run in stages computes the same numbers.
ag::Var Decoder::embed(ag::Tape& tape, const Tensor& ids, const ForwardOptions& options) {
  return config_.gpt2() ? gpt2_embed(tape, ids, 0, options) : llama_embed(tape, ids, 0);
}

ag::Var Decoder::run_blocks(ag::Tape& tape, ag::Var x, std::int64_t first, std::int64_t last,
                            const ForwardOptions& options) {
  if (config_.gpt2())
    return gpt2_blocks(tape, std::move(x), first, last, nullptr, options);
  // A stage's boundary is [B, T, C] (whole: stages exchange whole activations).
  const std::int64_t batch = x.dim(0), t = x.dim(1), c = config_.hidden;
  x = ag::reshape(tape, x, {batch * t, c});
  return ag::reshape(tape, llama_blocks(tape, x, first, last, batch, t, 0, nullptr), {batch, t, c});
}

ag::Var Decoder::head(ag::Tape& tape, const ag::Var& x) {
  if (config_.gpt2())
    return gpt2_head(tape, x);
  return llama_head(tape, ag::reshape(tape, x, {x.dim(0) * x.dim(1), config_.hidden}));
}

std::vector<std::size_t> Decoder::parameter_indices(std::int64_t first, std::int64_t last,
                                                    bool embeddings, bool with_head) const {
  std::vector<std::size_t> out;
  auto use = [&](std::size_t index) {  // once, in first-use order
    if (index != kNone && std::find(out.begin(), out.end(), index) == out.end())
      out.push_back(index);
  };
  if (embeddings) {
    use(embed_);
    if (config_.gpt2())
      use(positions_);
  }
  for (std::int64_t i = first; i < last; ++i) {
    const Block& b = blocks_[static_cast<std::size_t>(i)];
    if (config_.gpt2()) {  // each weight followed by its bias
      for (std::size_t w : {b.input_norm, b.q, b.o, b.post_norm, b.up, b.down}) {
        use(w);
        use(w + 1);
      }
      continue;
    }
    for (std::size_t p :
         {b.input_norm, b.q, b.q_bias, b.k, b.k_bias, b.v, b.v_bias, b.q_norm, b.k_norm, b.o,
          b.o_bias, b.post_norm, b.gate, b.gate_bias, b.up, b.up_bias, b.down, b.down_bias})
      use(p);
  }
  if (with_head) {
    use(final_norm_);
    if (config_.gpt2())
      use(final_norm_ + 1);
    use(lm_head_);  // the token embedding when tied
  }
  return out;
}

}  // namespace loom::nn
