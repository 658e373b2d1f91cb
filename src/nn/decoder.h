// nn/decoder.h — the decoder-only transformer as Hugging Face's `transformers` defines it for
// the families `llama`, `mistral`, `qwen2`, `qwen3` and `gpt2`. The Llama lineage: token
// embedding, pre-norm blocks of
// RMSNorm -> grouped-query self-attention with rotary positions -> residual, RMSNorm ->
// SwiGLU MLP -> residual, a final RMSNorm and an LM head (separate or tied to the
// embedding). What distinguishes the families is configuration, not code:
//   llama    attention_bias (q, k, v and o biases), mlp_bias, rope_scaling (linear, llama3)
//   mistral  as llama without biases; a sliding window longer than the context is a no-op
//   qwen2    q, k, v biases (no o bias), often tied embeddings
//   qwen3    RMSNorm of each query and key head before the rotation (q_norm, k_norm)
//   gpt2     learned positions, LayerNorm (with biases), one fused q/k/v projection, a
//            tanh-GELU MLP, a head tied to the embedding; biases everywhere; dropout on the
//            embeddings and both residual branches when the run asks for it
// Parameters carry the Hugging Face names and layouts (nn.Linear's [out, in]; GPT-2's Conv1D
// [in, out]), so a model folder loads and saves without renaming (nn/hf_config.h reads its
// config.json). Loom's `gpt` model is the gpt2 configuration (nn/gpt.h).
#pragma once

#include <string>
#include <string_view>

#include "nn/init.h"
#include "nn/model.h"

namespace loom::nn {

// The model_type values of the Llama lineage, Loom's model keys for them: llama, mistral,
// qwen2, qwen3. (gpt2 is the decoder's other configuration; its model key is gpt.)
inline bool is_decoder_family(std::string_view family) {
  return family == "llama" || family == "mistral" || family == "qwen2" || family == "qwen3";
}

// How the rotary frequencies are scaled for contexts beyond the trained one.
enum class RopeScaling { none, linear, llama3 };

struct DecoderConfig {
  std::string family = "llama";     // the model_type: llama | mistral | qwen2 | qwen3 | gpt2
  std::int64_t vocab = 256;         // vocab_size
  std::int64_t hidden = 64;         // hidden_size (C)
  std::int64_t intermediate = 172;  // intermediate_size (the MLP's width F)
  std::int64_t layers = 2;          // num_hidden_layers
  std::int64_t heads = 4;           // num_attention_heads (H)
  std::int64_t kv_heads = 4;        // num_key_value_heads (G, dividing H)
  std::int64_t head_dim = 16;       // D; hidden / heads unless the config says otherwise
  std::int64_t context = 128;       // max_position_embeddings
  double norm_eps = 1e-6;           // rms_norm_eps
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 1.0;                   // linear and llama3
  double rope_low_freq_factor = 1.0;          // llama3
  double rope_high_freq_factor = 4.0;         // llama3
  std::int64_t rope_original_context = 8192;  // llama3: original_max_position_embeddings
  bool qkv_bias = false;                      // biases on q_proj, k_proj, v_proj
  bool o_bias = false;                        // a bias on o_proj (llama's attention_bias)
  bool mlp_bias = false;                      // biases on gate_proj, up_proj, down_proj
  bool qk_norm = false;                       // qwen3: per-head RMSNorm of q and k
  bool tie_embeddings = false;                // lm_head is embed_tokens
  std::int64_t sliding_window = 0;            // mistral/qwen2: 0 none; else sequences
                                              // longer than the window are refused
  double init_std = 0.02;                     // initializer_range, for new weights
  // gpt2 only: the run's dropout probability (embeddings and residual branches, in training),
  // and whether biases train (false: they stay zero, nanoGPT's bias=False; still saved).
  double dropout = 0.0;
  bool train_biases = true;
  bool gpt2() const { return family == "gpt2"; }
  void validate() const;  // throws naming the field and value
};

// The rotary inverse frequencies theta^(-2i/D), i < D/2, scaled as rope_scaling says,
// computed in f32 step by step as transformers computes them (so the tables agree to the
// last bit or two). Position t turns pair i by the angle t * frequency[i].
std::vector<float> rope_inverse_frequencies(const DecoderConfig& config);

// Keys and values of the positions decoded so far, per layer ([B, length, G, D] each), so
// each new token attends to them without recomputing them.
// A parameter tensor parallelism split (Decoder::shard_tensor_parallel).
struct ShardedParameter {
  std::size_t index = 0;  // into parameters()
  int dim = 0;            // the dimension split
  int parts = 0;          // distinct slices: 0, one per rank; fewer, each held by several ranks
  int slice = 0;          // the slice this rank holds
  // Of a group of `ranks`: the distinct slices, and whether `rank` is the first of the ranks
  // holding its slice (the one that counts or writes it).
  int slices(int ranks) const { return parts > 0 ? parts : ranks; }
  bool first_holder(int rank, int ranks) const { return rank % (ranks / slices(ranks)) == 0; }
};

struct KvCache {
  std::vector<Tensor> keys, values;
  std::int64_t length = 0;
};

class Decoder : public Model {
 public:
  Decoder(const DecoderConfig& config, std::uint64_t seed, Backend& backend);
  std::vector<Parameter>& parameters() override { return params_; }
  // ids [B,T] i32 with T <= context -> logits [B*T, vocab].
  autograd::Var forward(autograd::Tape& tape, const Tensor& ids,
                        const ForwardOptions& options) override;
  // Inference with a KV cache: ids [B, T] are the positions after the cache's; returns their
  // logits [B*T, vocab] and appends their keys and values to the cache. A cache of length 0
  // starts a sequence; the length may reach max_position_embeddings.
  Tensor decode(const Tensor& ids, KvCache& cache);
  // Loom's name for the gpt2 configuration is its model key, gpt.
  std::string kind() const override { return config_.gpt2() ? "gpt" : config_.family; }
  const DecoderConfig& config() const { return config_; }

  // The forward pass in pieces, for pipeline stages (every family): forward =
  // head(run_blocks(embed)). embed: ids [B,T] -> x [B,T,C]; run_blocks: blocks [first, last);
  // head: the final norm and the LM head, x [B,T,C] -> logits [B*T, vocab].
  autograd::Var embed(autograd::Tape& tape, const Tensor& ids, const ForwardOptions& options);
  autograd::Var run_blocks(autograd::Tape& tape, autograd::Var x, std::int64_t first,
                           std::int64_t last, const ForwardOptions& options);
  autograd::Var head(autograd::Tape& tape, const autograd::Var& x);
  // Indices into parameters() of what those pieces use (the token embedding once, also
  // when both the embeddings and the head are asked for).
  std::vector<std::size_t> parameter_indices(std::int64_t first, std::int64_t last, bool embeddings,
                                             bool head) const;
  std::size_t token_embedding_index() const { return embed_; }
  bool tied_head() const { return lm_head_ == embed_; }  // the LM head is the token embedding

  // Tensor parallelism (docs/parallel.md; the Llama lineage): keeps rank `rank` of `size`'s
  // slice of each parameter the layout table shards (q, k, v, gate and up column-parallel,
  // their biases with them; o and down row-parallel), and marks its placement; the query and
  // key/value heads divide among the ranks, or the ranks among them (then each key/value
  // head is held by size / kv_heads ranks: Placement::parts). Call after the weights are
  // loaded; run the model under a TensorGroupScope of those ranks. Sizes that do not divide
  // are named errors. Returns the sharded parameters.
  std::vector<ShardedParameter> shard_tensor_parallel(int rank, int size);

 private:
  // Indices into params_; npos where the configuration has no such tensor. gpt2 uses
  // input_norm (ln_1), q (the fused c_attn), o (attn.c_proj), post_norm (ln_2), up (c_fc) and
  // down (mlp.c_proj), each weight followed by its bias.
  struct Block {
    std::size_t input_norm, q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm, post_norm,
        gate, up, down, gate_bias, up_bias, down_bias;
  };
  void build_llama(Rng& rng, Backend& backend);
  void build_gpt2(Rng& rng, Backend& backend);  // nn/decoder_gpt2.cpp
  autograd::Var& param(std::size_t index) { return params_[index].var; }
  // x [N, in] times the [out, in] weight, plus the bias when there is one.
  autograd::Var project(autograd::Tape& tape, const autograd::Var& x, std::size_t weight,
                        std::size_t bias);
  // cache: the layer's keys and values before these positions (grown), or null in training.
  autograd::Var attention_block(autograd::Tape& tape, const autograd::Var& x, const Block& b,
                                std::int64_t batch, std::int64_t t, std::int64_t position,
                                Tensor* cached_keys, Tensor* cached_values);
  // The whole model over positions [position, position + T) of ids [B, T].
  autograd::Var run(autograd::Tape& tape, const Tensor& ids, std::int64_t position, KvCache* cache,
                    const ForwardOptions& options);
  autograd::Var mlp_block(autograd::Tape& tape, const autograd::Var& x, const Block& b);
  // The Llama lineage in pieces: ids [B,T] -> embeddings [B,T,C] (positions [position,
  // position + T) checked against the context); blocks [first, last) over the stream as
  // rows [B*T, C] (B and T whole); the final norm and the LM head, rows -> logits
  // [B*T, vocab].
  autograd::Var llama_embed(autograd::Tape& tape, const Tensor& ids, std::int64_t position);
  autograd::Var llama_blocks(autograd::Tape& tape, autograd::Var x, std::int64_t first,
                             std::int64_t last, std::int64_t batch, std::int64_t t,
                             std::int64_t position, KvCache* cache);
  autograd::Var llama_head(autograd::Tape& tape, const autograd::Var& x);
  // gpt2 (nn/decoder_gpt2.cpp): the embeddings of positions [position, position + T), and
  // blocks [first, last) with their keys and values appended to the cache when there is one.
  autograd::Var gpt2_embed(autograd::Tape& tape, const Tensor& ids, std::int64_t position,
                           const ForwardOptions& options);
  autograd::Var gpt2_blocks(autograd::Tape& tape, autograd::Var x, std::int64_t first,
                            std::int64_t last, KvCache* cache, const ForwardOptions& options);
  autograd::Var gpt2_head(autograd::Tape& tape, const autograd::Var& x);
  autograd::Var dropout(autograd::Tape& tape, const autograd::Var& x, const ForwardOptions& options,
                        std::uint64_t site);

  DecoderConfig config_;
  std::vector<Parameter> params_;
  std::size_t embed_ = 0, final_norm_ = 0, lm_head_ = 0;
  std::size_t positions_ = 0;  // gpt2: the learned position embedding (wpe)
  int tensor_parallel_ = 1;    // the ranks its parameters are sharded over
  std::vector<Block> blocks_;
  Tensor cos_, sin_, neg_sin_;  // [context, D/2] on the model's device
};

}  // namespace loom::nn
