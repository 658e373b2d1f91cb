// Parity with transformers: tests/fixtures/decoders/<family>/ holds a tiny random model of
// each decoder family as transformers saved it (config.json, model.safetensors) and what
// transformers computed with it (reference.safetensors: logits, loss, every gradient, 20
// AdamW steps; tools/make_decoder_fixtures.py). Loom reads the folder as a user's would
// and must reproduce them.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/devices.h"
#include "io/safetensors.h"
#include "nn/decoder.h"
#include "nn/hf_config.h"
#include "optim/adamw.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

std::string folder(const std::string& family) {
  return source_dir() + "/tests/fixtures/decoders/" + family;
}

struct Reference {
  explicit Reference(const std::string& family)
      : file(io::SafetensorsFile::read(folder(family) + "/reference.safetensors")) {}
  io::SafetensorsFile file;
  Tensor tensor(const std::string& name, Backend& backend) const {
    const io::SafetensorsEntry* e = file.find(name);
    if (e == nullptr)
      throw Error(file.path() + " lacks " + name);
    return file.load_f32(*e, backend);
  }
  Tensor ids(const std::string& name, Backend& backend) const {
    Tensor t = tensor(name, cpu());
    std::vector<float> f = t.to_floats();
    return Tensor::from_ints(t.shape(), std::vector<std::int32_t>(f.begin(), f.end()), backend);
  }
};

std::unique_ptr<nn::Decoder> load(const std::string& family, Backend& backend) {
  nn::DecoderConfig config = nn::read_hf_config(folder(family) + "/config.json");
  auto model = std::make_unique<nn::Decoder>(config, 0, backend);
  train::load_weights(folder(family) + "/model.safetensors", *model);
  return model;
}

// max |a - b| over max |b|: the measure of the parity targets.
double max_relative(const Tensor& a, const Tensor& b) {
  std::vector<double> av = values(a), bv = values(b);
  EXPECT_EQ(av.size(), bv.size());
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < av.size() && i < bv.size(); ++i) {
    diff = std::max(diff, std::abs(av[i] - bv[i]));
    scale = std::max(scale, std::abs(bv[i]));
  }
  return diff / scale;
}

class DecoderParity : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderParity, LogitsEqualTransformersWithin1e5) {
  Reference ref(GetParam());
  auto model = load(GetParam(), cpu());
  ag::Tape tape;
  ag::Var logits = model->forward(tape, ref.ids("batch.x", cpu()), {});
  EXPECT_LE(max_relative(logits.value(), ref.tensor("logits", cpu())), 1e-5);
}

TEST_P(DecoderParity, LossAndEveryGradient) {
  Reference ref(GetParam());
  auto model = load(GetParam(), cpu());
  ag::Tape tape;
  Tensor y = ref.ids("batch.y", cpu()).reshape({-1});
  ag::Var loss = ag::cross_entropy(tape, model->forward(tape, ref.ids("batch.x", cpu()), {}), y);
  double expected = ref.tensor("loss", cpu()).item();
  EXPECT_NEAR(loss.value().item(), expected, 1e-5 * expected);
  tape.backward(loss);
  for (nn::Parameter& p : model->parameters()) {
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.var.grad().defined());
    EXPECT_LE(max_relative(p.var.grad(), ref.tensor("grad." + p.name, cpu())), 1e-4);
  }
}

TEST_P(DecoderParity, TwentyAdamWStepsGiveTheSameLossesAndParameters) {
  Reference ref(GetParam());
  auto model = load(GetParam(), cpu());
  auto cfg = nlohmann::json::parse(ref.file.metadata().at("adamw"));
  optim::AdamW opt(model->parameters(),
                   {cfg["betas"][0], cfg["betas"][1], cfg["eps"], cfg["weight_decay"]});
  std::vector<float> expected = ref.tensor("adamw_losses", cpu()).to_floats();
  ASSERT_EQ(expected.size(), 20u);
  Tensor x = ref.ids("batch.x", cpu()), y = ref.ids("batch.y", cpu()).reshape({-1});
  for (std::size_t step = 0; step < expected.size(); ++step) {
    ag::Tape tape;
    ag::Var loss = ag::cross_entropy(tape, model->forward(tape, x, {}), y);
    EXPECT_NEAR(loss.value().item(), expected[step], 1e-5 * expected[step]) << "step " << step;
    tape.backward(loss);
    opt.step(cfg["lr"]);
    opt.zero_grad();
  }
  const double lr = cfg["lr"];
  for (nn::Parameter& p : model->parameters()) {
    SCOPED_TRACE(p.name);
    Tensor expected_value = ref.tensor("final." + p.name, cpu());
    if (p.name.ends_with("attn.c_attn.bias")) {
      // GPT-2's key bias adds q.b to every score of a query's row, which softmax cancels: its
      // gradient is zero but for rounding, and AdamW turns that noise into steps of up to lr
      // in either direction. The query and value biases must agree; the key bias only stay
      // within the 20 steps' reach of the reference.
      const std::int64_t c = p.var.shape()[0] / 3;
      for (std::int64_t part : {0, 2})
        EXPECT_LE(max_relative(p.var.value().slice(0, part * c, (part + 1) * c),
                               expected_value.slice(0, part * c, (part + 1) * c)),
                  1e-4);
      std::vector<double> ours = values(p.var.value().slice(0, c, 2 * c)),
                          theirs = values(expected_value.slice(0, c, 2 * c));
      for (std::size_t i = 0; i < ours.size(); ++i)
        EXPECT_LE(std::abs(ours[i] - theirs[i]), 2.0 * lr * static_cast<double>(expected.size()));
      continue;
    }
    EXPECT_LE(max_relative(p.var.value(), expected_value), 1e-4);
  }
}

TEST_P(DecoderParity, GreedyDecodingWithAKvCacheGivesTheTokensGenerateGives) {
  Reference ref(GetParam());
  auto model = load(GetParam(), cpu());
  std::vector<float> prompt = ref.tensor("greedy.prompt", cpu()).to_floats();
  std::vector<float> expected = ref.tensor("greedy.tokens", cpu()).to_floats();
  train::SampleOptions greedy;
  greedy.tokens = static_cast<std::int64_t>(expected.size());
  greedy.temperature = 0.0;
  std::vector<std::int32_t> tokens =
      train::generate(*model, std::vector<std::int32_t>(prompt.begin(), prompt.end()),
                      model->config().context, greedy, cpu());
  EXPECT_EQ(tokens, std::vector<std::int32_t>(expected.begin(), expected.end()));
}

// Nucleus sampling keeps the most likely tokens holding top_p of the mass: with a tiny top_p
// only the most likely one is left, so sampling at temperature 1 gives generate's greedy
// tokens; with top_p 1 the same seed draws other tokens (the random models' distributions
// are broad), and the same tokens again from the same seed.
TEST_P(DecoderParity, NucleusSamplingKeepsTheMostLikelyTokens) {
  Reference ref(GetParam());
  auto model = load(GetParam(), cpu());
  std::vector<float> prompt_f = ref.tensor("greedy.prompt", cpu()).to_floats();
  std::vector<float> greedy_f = ref.tensor("greedy.tokens", cpu()).to_floats();
  const std::vector<std::int32_t> prompt(prompt_f.begin(), prompt_f.end()),
      greedy(greedy_f.begin(), greedy_f.end());
  train::SampleOptions o;
  o.tokens = static_cast<std::int64_t>(greedy.size());
  o.temperature = 1.0;
  o.top_p = 1e-6;
  EXPECT_EQ(train::generate(*model, prompt, model->config().context, o, cpu()), greedy);
  o.top_p = 1.0;
  const std::vector<std::int32_t> drawn =
      train::generate(*model, prompt, model->config().context, o, cpu());
  EXPECT_NE(drawn, greedy);
  EXPECT_EQ(train::generate(*model, prompt, model->config().context, o, cpu()), drawn);
}

// Decoding a prompt, then one token at a time through the cache, gives each position the
// logits the whole sequence's forward pass gives it.
TEST_P(DecoderParity, CachedDecodingEqualsTheWholeSequencesForwardPass) {
  Reference ref(GetParam());
  auto model = load(GetParam(), cpu());
  Tensor x = ref.ids("batch.x", cpu());
  const std::int64_t b = x.dim(0), t = x.dim(1), prefix = 5;
  ag::Tape tape;
  std::vector<float> whole = model->forward(tape, x, {}).value().to_floats();
  const std::int64_t v = static_cast<std::int64_t>(whole.size()) / (b * t);
  nn::KvCache cache;
  std::vector<float> pieces = model->decode(x.slice(1, 0, prefix), cache).to_floats();
  std::vector<std::vector<float>> rows(static_cast<std::size_t>(b));
  for (std::int64_t r = 0; r < b; ++r)
    rows[r].assign(pieces.begin() + r * prefix * v, pieces.begin() + (r + 1) * prefix * v);
  for (std::int64_t i = prefix; i < t; ++i) {
    std::vector<float> step = model->decode(x.slice(1, i, i + 1), cache).to_floats();
    for (std::int64_t r = 0; r < b; ++r)
      rows[r].insert(rows[r].end(), step.begin() + r * v, step.begin() + (r + 1) * v);
  }
  EXPECT_EQ(cache.length, t);
  std::vector<float> cached;
  for (const auto& row : rows)
    cached.insert(cached.end(), row.begin(), row.end());
  EXPECT_LE(max_relative(Tensor::from_floats({b * t, v}, cached, cpu()),
                         Tensor::from_floats({b * t, v}, whole, cpu())),
            1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderParity,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3", "gpt2"));

// The same logits on every other backend (native kernels, decompositions or the counted
// fallback, whichever each backend has).
class DecoderOnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderOnBackend, LlamaLogitsEqualTransformersWithin1e5) {
  Backend& backend = backend_named(GetParam());
  Reference ref("llama");
  auto model = load("llama", backend);
  ag::Tape tape;
  ag::Var logits = model->forward(tape, ref.ids("batch.x", backend), {});
  EXPECT_LE(max_relative(logits.value().to(cpu()), ref.tensor("logits", cpu())), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, DecoderOnBackend, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

// ---- config.json: what is read, and what is refused by name -------------------------------

std::string llama_json(const std::string& extra) {
  return R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
             "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4)" +
         extra + "}";
}

std::string refusal(const std::string& text) {
  try {
    nn::decoder_config_from_hf_json(text, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, ReadsTheFieldsAndDefaults) {
  nn::DecoderConfig c = nn::decoder_config_from_hf_json(
      llama_json(R"(, "num_key_value_heads": 2, "rope_theta": 500000.0,
                    "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192},
                    "torch_dtype": "bfloat16", "bos_token_id": 1)"),
      "cfg.json");
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, nn::RopeScaling::llama3);
  EXPECT_EQ(c.rope_factor, 32.0);
  EXPECT_FALSE(c.qkv_bias);
  nn::DecoderConfig q = nn::read_hf_config(folder("qwen2") + "/config.json");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias);
  EXPECT_TRUE(q.tie_embeddings);
  EXPECT_EQ(q.rope_scaling, nn::RopeScaling::linear);
  EXPECT_TRUE(nn::read_hf_config(folder("qwen3") + "/config.json").qk_norm);
}

TEST(HfConfig, RefusesWhatLoomDoesNotImplementByName) {
  EXPECT_NE(refusal(R"({"model_type": "gemma2", "vocab_size": 4})").find("model_type 'gemma2'"),
            std::string::npos);
  std::string yarn =
      refusal(llama_json(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"));
  EXPECT_NE(yarn.find("rope_type 'yarn'"), std::string::npos) << yarn;
  std::string field = refusal(llama_json(R"(, "logit_softcapping": 30.0)"));
  EXPECT_NE(field.find("cfg.json: field 'logit_softcapping'"), std::string::npos) << field;
  std::string act = refusal(llama_json(R"(, "hidden_act": "gelu")"));
  EXPECT_NE(act.find("field 'hidden_act' is \"gelu\""), std::string::npos) << act;
  std::string type = refusal(llama_json(R"(, "num_key_value_heads": "2")"));
  EXPECT_NE(type.find("field 'num_key_value_heads' is \"2\", expected an integer"),
            std::string::npos)
      << type;
  std::string groups = refusal(llama_json(R"(, "num_key_value_heads": 3)"));
  EXPECT_NE(groups.find("not a multiple of num_key_value_heads = 3"), std::string::npos) << groups;
  EXPECT_NE(refusal("[1, 2]").find("cfg.json: not a JSON object"), std::string::npos);
}

TEST(HfConfig, ASlidingWindowIsRefusedOnlyWhenTheSequenceExceedsIt) {
  nn::DecoderConfig c = nn::read_hf_config(folder("mistral") + "/config.json");
  EXPECT_EQ(c.sliding_window, 4096);
  c.sliding_window = 8;
  nn::Decoder model(c, 1, cpu());
  ag::Tape tape;
  std::vector<std::int32_t> ids(9, 3);
  EXPECT_NO_THROW(
      model.forward(tape, Tensor::from_ints({1, 8}, {ids.begin(), ids.end() - 1}, cpu()), {}));
  try {
    model.forward(tape, Tensor::from_ints({1, 9}, ids, cpu()), {});
    FAIL() << "a sequence longer than the window was run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds sliding_window = 8"), std::string::npos);
  }
}

TEST(HfConfig, WrittenConfigReadsBackTheSame) {
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    nn::DecoderConfig c = nn::read_hf_config(folder(family) + "/config.json");
    nn::DecoderConfig back = nn::decoder_config_from_hf_json(nn::hf_config_json(c), "written");
    EXPECT_EQ(nn::hf_config_json(back), nn::hf_config_json(c));
    EXPECT_EQ(back.qkv_bias, c.qkv_bias);
    EXPECT_EQ(back.o_bias, c.o_bias);
    EXPECT_EQ(back.rope_scaling, c.rope_scaling);
  }
}

}  // namespace
}  // namespace loom::testing
