// nn/gpt.h — Loom's GPT: the decoder's gpt2 configuration (nn/decoder.h), GPT-2 exactly as
// Hugging Face defines it, sized by Loom's run keys (width of 4C MLP, LayerNorm eps 1e-5,
// initializer range 0.02). Parameters carry GPT-2's names and Conv1D layouts, so checkpoints
// load into transformers' GPT2LMHeadModel.
#pragma once

#include "nn/decoder.h"

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

// The decoder configuration of a GPT: family gpt2, MLP width 4C.
DecoderConfig gpt2_config(const GptConfig& config);

class Gpt final : public Decoder {
 public:
  Gpt(const GptConfig& config, std::uint64_t seed, Backend& backend);
};

}  // namespace loom::nn
