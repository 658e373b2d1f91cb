#include "nn/gpt.h"

#include "core/error.h"

namespace loom::nn {

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

DecoderConfig gpt2_config(const GptConfig& g) {
  g.validate();
  DecoderConfig c;
  c.family = "gpt2";
  c.vocab = g.vocab;
  c.hidden = g.width;
  c.intermediate = 4 * g.width;
  c.layers = g.layers;
  c.heads = c.kv_heads = g.heads;
  c.head_dim = g.width / g.heads;
  c.context = g.context;
  c.norm_eps = 1e-5;
  c.tie_embeddings = true;
  c.init_std = 0.02;
  c.dropout = g.dropout;
  c.train_biases = g.bias;
  return c;
}

Gpt::Gpt(const GptConfig& config, std::uint64_t seed, Backend& backend)
    : Decoder(gpt2_config(config), seed, backend) {}

}  // namespace loom::nn
