// nn/gpt.h — GPT-2 exactly as Hugging Face defines it: learned token and position
// embeddings, pre-LN blocks (LayerNorm eps 1e-5), fused qkv projection, causal
// self-attention, tanh-approximated GELU MLP of width 4C, final LayerNorm, and an LM
// head tied to the token embedding. Parameters carry HF GPT-2 names and Conv1D
// layouts ([in, out]), so checkpoints load into transformers' GPT2LMHeadModel.
#pragma once

#include "nn/init.h"
#include "nn/model.h"

namespace loom::nn {

struct GptConfig {
  std::int64_t vocab = 65;
  std::int64_t context = 64;  // n_positions
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t width = 128;  // n_embd
  double dropout = 0.0;      // residual and embedding dropout (HF resid_pdrop/embd_pdrop)
  bool bias = true;          // false: biases of Linear and LayerNorm stay zero and are not
                             // trained (nanoGPT's bias=False); they are still saved, as
                             // zeros, so the checkpoint loads into HF GPT-2 unchanged
  void validate() const;     // throws naming the field and value
};

class Gpt final : public Model {
 public:
  Gpt(const GptConfig& config, std::uint64_t seed, Backend& backend);
  std::vector<Parameter>& parameters() override { return params_; }
  // ids [B,T] i32 with T <= context -> logits [B*T, vocab].
  autograd::Var forward(autograd::Tape& tape, const Tensor& ids,
                        const ForwardOptions& options) override;
  std::string kind() const override { return "gpt"; }
  const GptConfig& config() const { return config_; }

  // The forward pass in pieces, for pipeline stages: forward = head(run_blocks(embed)).
  // embed: ids [B,T] -> x [B,T,C]; run_blocks: blocks [first, last); head: final
  // LayerNorm and the tied LM head, x [B,T,C] -> logits [B*T, vocab].
  autograd::Var embed(autograd::Tape& tape, const Tensor& ids, const ForwardOptions& options);
  autograd::Var run_blocks(autograd::Tape& tape, autograd::Var x, std::int64_t first,
                           std::int64_t last, const ForwardOptions& options);
  autograd::Var head(autograd::Tape& tape, const autograd::Var& x);
  // Indices into parameters() of what those pieces use (the token embedding once, also
  // when both the embeddings and the head are asked for).
  std::vector<std::size_t> parameter_indices(std::int64_t first, std::int64_t last, bool embeddings,
                                             bool head) const;
  std::size_t token_embedding_index() const { return wte_; }

 private:
  struct Block {  // indices into params_
    std::size_t ln1, attn, attn_proj, ln2, fc, proj;
  };
  autograd::Var& param(std::size_t index) { return params_[index].var; }
  autograd::Var dropout(autograd::Tape& tape, const autograd::Var& x, const ForwardOptions& options,
                        std::uint64_t site);

  GptConfig config_;
  std::vector<Parameter> params_;
  std::size_t wte_ = 0, wpe_ = 0, ln_f_ = 0;
  std::vector<Block> blocks_;
};

}  // namespace loom::nn
