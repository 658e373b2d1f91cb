// The decoder's tensor-parallel layout as data (docs/parallel.md): which parameters are
// sharded, along which dimension; the autograd rules (autograd/tensor_parallel.h) do the rest:
// the decoder's forward is the one-process code, its reshapes written with the whole sizes.
#include <string_view>

#include "core/error.h"
#include "dispatch/dispatch.h"
#include "nn/decoder.h"

namespace loom::nn {
namespace {

// Parameters by name suffix and the dimension each is sharded along (nn.Linear's [out, in]:
// 0 column-parallel, 1 row-parallel); every other parameter is replicated.
constexpr std::pair<std::string_view, int> kTensorParallelLayout[] = {
    {"self_attn.q_proj.weight", 0},
    {"self_attn.q_proj.bias", 0},
    {"self_attn.k_proj.weight", 0},
    {"self_attn.k_proj.bias", 0},
    {"self_attn.v_proj.weight", 0},
    {"self_attn.v_proj.bias", 0},
    {"self_attn.o_proj.weight", 1},
    {"mlp.gate_proj.weight", 0},
    {"mlp.gate_proj.bias", 0},
    {"mlp.up_proj.weight", 0},
    {"mlp.up_proj.bias", 0},
    {"mlp.down_proj.weight", 1},
    // vocab-parallel, when the vocabulary divides among the ranks (else replicated)
    {"model.embed_tokens.weight", 0},
    {"lm_head.weight", 0},
};

}  // namespace

std::vector<ShardedParameter> Decoder::shard_tensor_parallel(int rank, int size) {
  const std::string what =
      config_.family + ": tensor parallelism over " + std::to_string(size) + " ranks";
  check(!config_.gpt2(), what + ": the gpt2 configuration is not split yet (the Llama lineage is)");
  check(size >= 1 && rank >= 0 && rank < size,
        what + ": rank " + std::to_string(rank) + " is outside the group");
  check(tensor_parallel_ == 1, what + ": the model is already sharded");
  check(config_.heads % size == 0,
        what + ": num_attention_heads = " + std::to_string(config_.heads) + " does not divide");
  // Key/value heads fewer than the ranks: each is held by size / kv_heads ranks, those whose
  // query heads use it (rank r's queries are heads [r H/T, (r+1) H/T), grouped onto key/value
  // head r G/T when T is a multiple of G).
  const bool kv_replicated = config_.kv_heads < size;
  check(config_.kv_heads % size == 0 || size % config_.kv_heads == 0,
        what + ": num_key_value_heads = " + std::to_string(config_.kv_heads) +
            " does not divide among the ranks, nor the ranks among the heads");
  check(
      config_.intermediate % size == 0,
      what + ": intermediate_size = " + std::to_string(config_.intermediate) + " does not divide");
  std::vector<ShardedParameter> sharded;
  if (size == 1)
    return sharded;
  const bool vocab_parallel = config_.vocab % size == 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    for (const auto& [suffix, dim] : kTensorParallelLayout) {
      if (!std::string_view(p.name).ends_with(suffix))
        continue;
      if (!vocab_parallel && (suffix.starts_with("model.embed") || suffix.starts_with("lm_head")))
        continue;
      const bool key_value =
          suffix.starts_with("self_attn.k_") || suffix.starts_with("self_attn.v_");
      ShardedParameter s{i, dim, 0, rank};
      if (key_value && kv_replicated) {
        s.parts = static_cast<int>(config_.kv_heads);
        s.slice = rank * s.parts / size;
      }
      const int count = s.slices(size);
      const Tensor& whole = p.var.value();
      const std::int64_t part = whole.dim(dim) / count;
      p.var.set_value(dispatch::contiguous(whole.slice(dim, s.slice * part, (s.slice + 1) * part)));
      autograd::Placement placement;
      placement.shard = dim;
      placement.parts = s.parts;
      p.var.set_placement(placement);
      sharded.push_back(s);
    }
  }
  tensor_parallel_ = size;
  return sharded;
}

}  // namespace loom::nn
