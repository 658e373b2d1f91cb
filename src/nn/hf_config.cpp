#include "nn/hf_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace loom::nn {

namespace {

using Json = nlohmann::json;

// Fields that describe the checkpoint or steer transformers' runtime, not the model's math.
const std::set<std::string, std::less<>> kDescriptive = {"architectures",
                                                         "auto_map",
                                                         "bos_token_id",
                                                         "eos_token_id",
                                                         "pad_token_id",
                                                         "torch_dtype",
                                                         "dtype",
                                                         "transformers_version",
                                                         "use_cache",
                                                         "_name_or_path",
                                                         "output_attentions",
                                                         "output_hidden_states",
                                                         "return_dict",
                                                         "model_type",
                                                         "max_window_layers",
                                                         "use_sliding_window",
                                                         "layer_types",
                                                         "initializer_range",
                                                         "tie_word_embeddings",
                                                         "chunk_size_feed_forward",
                                                         "id2label",
                                                         "label2id",
                                                         "problem_type",
                                                         "tokenizer_class",
                                                         "attn_implementation",
                                                         "bos_token",
                                                         "eos_token"};

class Reader {
 public:
  Reader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& field, const Json& value,
                         const std::string& expected) const {
    throw Error(where_ + ": field '" + field + "' is " + value.dump() + ", expected " + expected);
  }
  void mark(const std::string& field) { used_.insert(field); }
  bool has(const std::string& field) const { return j_.contains(field) && !j_[field].is_null(); }
  const Json& at(const std::string& field) {
    used_.insert(field);
    return j_.at(field);
  }
  std::int64_t integer(const std::string& field, std::int64_t lo, std::int64_t hi) {
    check(j_.contains(field), where_ + ": field '" + field + "' is missing");
    const Json& v = at(field);
    if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      fail(field, v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v.get<std::int64_t>();
  }
  std::int64_t integer_or(const std::string& field, std::int64_t fallback, std::int64_t lo,
                          std::int64_t hi) {
    used_.insert(field);
    return has(field) ? integer(field, lo, hi) : fallback;
  }
  double number_or(const std::string& field, double fallback) {
    used_.insert(field);
    if (!has(field))
      return fallback;
    const Json& v = at(field);
    if (!v.is_number())
      fail(field, v, "a number");
    return v.get<double>();
  }
  bool boolean_or(const std::string& field, bool fallback) {
    used_.insert(field);
    if (!has(field))
      return fallback;
    const Json& v = at(field);
    if (!v.is_boolean())
      fail(field, v, "true or false");
    return v.get<bool>();
  }
  std::string string_or(const std::string& field, const std::string& fallback) {
    used_.insert(field);
    if (!has(field))
      return fallback;
    const Json& v = at(field);
    if (!v.is_string())
      fail(field, v, "a string");
    return v.get<std::string>();
  }
  // Every field neither read nor merely descriptive changes the model in a way Loom
  // does not implement: name it rather than train a different model.
  void refuse_unread() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (used_.count(it.key()) || kDescriptive.count(it.key()))
        continue;
      throw Error(where_ + ": field '" + it.key() + "' (" + it.value().dump() +
                  ") is a setting Loom does not implement (docs/models.md lists those it does)");
    }
  }
  const std::string& where() const { return where_; }

 private:
  const Json& j_;
  std::string where_;
  std::set<std::string> used_;
};

// The rotary settings, from rope_parameters (transformers 5) or rope_theta + rope_scaling.
void read_rope(Reader& r, DecoderConfig& c) {
  Json params = Json::object();
  std::string source = "rope_parameters";
  if (r.has("rope_parameters")) {
    params = r.at("rope_parameters");
  } else if (r.has("rope_scaling")) {
    params = r.at("rope_scaling");
    source = "rope_scaling";
  }
  r.mark("rope_scaling");  // null, or read above
  if (!params.is_object())
    r.fail(source, params, "an object of rotary settings");
  c.rope_theta = r.number_or("rope_theta", 10000.0);
  Reader p(params, r.where() + ": " + source);
  if (params.contains("rope_theta"))
    c.rope_theta = p.number_or("rope_theta", c.rope_theta);
  std::string type = p.string_or("rope_type", p.string_or("type", "default"));
  if (type == "default") {
    c.rope_scaling = RopeScaling::none;
  } else if (type == "linear") {
    c.rope_scaling = RopeScaling::linear;
    c.rope_factor = p.number_or("factor", 1.0);
  } else if (type == "llama3") {
    c.rope_scaling = RopeScaling::llama3;
    c.rope_factor = p.number_or("factor", 8.0);
    c.rope_low_freq_factor = p.number_or("low_freq_factor", 1.0);
    c.rope_high_freq_factor = p.number_or("high_freq_factor", 4.0);
    c.rope_original_context = p.integer_or("original_max_position_embeddings", 8192, 1, 1 << 30);
  } else {
    throw Error(r.where() + ": " + source + ".rope_type '" + type +
                "' is not implemented (default, linear, llama3)");
  }
  p.number_or("partial_rotary_factor", 1.0);
  if (params.contains("partial_rotary_factor") && params["partial_rotary_factor"] != 1.0)
    p.fail("partial_rotary_factor", params["partial_rotary_factor"], "1.0 (all of each head)");
  p.refuse_unread();
}

// Every field read or known, and the whole valid.
DecoderConfig checked(const Reader& r, const DecoderConfig& c) {
  r.refuse_unread();
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(r.where() + ": " + e.what());
  }
  return c;
}

// GPT-2's fields (transformers' GPT2Config): sizes under their own names, LayerNorm, a tied
// head, tanh GELU. Dropout probabilities are read past: they are training settings, and a
// Loom run's own `dropout` decides (embeddings and residual branches; attention dropout is
// not implemented).
void read_gpt2(Reader& r, DecoderConfig& c, const Json& j) {
  constexpr std::int64_t kBig = std::int64_t{1} << 31;
  c.vocab = r.integer("vocab_size", 1, kBig);
  c.context = r.integer_or("n_positions", 1024, 1, kBig);
  c.hidden = r.integer_or("n_embd", 768, 1, kBig);
  c.layers = r.integer_or("n_layer", 12, 1, 1 << 16);
  c.heads = c.kv_heads = r.integer_or("n_head", 12, 1, 1 << 16);
  if (c.hidden % c.heads != 0)
    r.fail("n_head", j["n_head"], "a divisor of n_embd = " + std::to_string(c.hidden));
  c.head_dim = c.hidden / c.heads;
  c.intermediate = r.integer_or("n_inner", 4 * c.hidden, 1, kBig);
  c.norm_eps = r.number_or("layer_norm_epsilon", 1e-5);
  c.init_std = r.number_or("initializer_range", 0.02);
  c.tie_embeddings = true;
  const std::string act = r.string_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    r.fail("activation_function", j["activation_function"],
           "\"gelu_new\" (GELU's tanh approximation)");
  if (!r.boolean_or("tie_word_embeddings", true))
    r.fail("tie_word_embeddings", j["tie_word_embeddings"], "true (GPT-2's head is its embedding)");
  if (!r.boolean_or("scale_attn_weights", true))
    r.fail("scale_attn_weights", j["scale_attn_weights"], "true (scores over sqrt(head size))");
  if (r.boolean_or("scale_attn_by_inverse_layer_idx", false))
    r.fail("scale_attn_by_inverse_layer_idx", j["scale_attn_by_inverse_layer_idx"], "false");
  if (r.boolean_or("add_cross_attention", false))
    r.fail("add_cross_attention", j["add_cross_attention"], "false (a decoder-only model)");
  // Only where attention runs in f16 does reordering change a result; Loom computes it in f32.
  r.boolean_or("reorder_and_upcast_attn", false);
  for (const char* field : {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"})
    r.number_or(field, 0.0);
  // The classification head of GPT2DoubleHeadsModel, not part of the language model; n_ctx
  // is n_positions' old name.
  for (const char* field : {"summary_type", "summary_use_proj", "summary_activation",
                            "summary_proj_to_labels", "n_ctx", "task_specific_params"})
    r.mark(field);
}

}  // namespace

DecoderConfig decoder_config_from_hf_json(const std::string& text, const std::string& where) {
  const Json j = Json::parse(text, nullptr, false);
  check(!j.is_discarded() && j.is_object(), where + ": not a JSON object (a model configuration)");
  Reader r(j, where);
  DecoderConfig c;
  check(j.contains("model_type") && j["model_type"].is_string(),
        where + ": field 'model_type' is missing or not a string");
  c.family = j["model_type"].get<std::string>();
  check(is_decoder_family(c.family) || c.gpt2(),
        where + ": model_type '" + c.family +
            "' is not implemented (llama, mistral, qwen2, qwen3, gpt2)");
  if (c.gpt2()) {
    read_gpt2(r, c, j);
    return checked(r, c);
  }
  constexpr std::int64_t kBig = std::int64_t{1} << 31;
  c.vocab = r.integer("vocab_size", 1, kBig);
  c.hidden = r.integer("hidden_size", 1, kBig);
  c.intermediate = r.integer("intermediate_size", 1, kBig);
  c.layers = r.integer("num_hidden_layers", 1, 1 << 16);
  c.heads = r.integer("num_attention_heads", 1, 1 << 16);
  c.kv_heads = r.integer_or("num_key_value_heads", c.heads, 1, 1 << 16);
  if (c.hidden % c.heads != 0 && !r.has("head_dim"))
    throw Error(where + ": hidden_size " + std::to_string(c.hidden) +
                " is not divisible by num_attention_heads " + std::to_string(c.heads) +
                " and no head_dim is given");
  c.head_dim = r.integer_or("head_dim", c.hidden / c.heads, 2, 1 << 16);
  c.context = r.integer_or("max_position_embeddings", 2048, 1, kBig);
  c.norm_eps = r.number_or("rms_norm_eps", 1e-6);
  c.init_std = r.number_or("initializer_range", 0.02);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  read_rope(r, c);

  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu")
    r.fail("hidden_act", j["hidden_act"], "\"silu\" (the SwiGLU MLP)");
  if (r.number_or("attention_dropout", 0.0) != 0.0)
    r.fail("attention_dropout", j["attention_dropout"], "0 (attention dropout is not implemented)");
  if (r.integer_or("pretraining_tp", 1, 0, 1 << 16) != 1)
    r.fail("pretraining_tp", j["pretraining_tp"], "1");
  const bool attention_bias = r.boolean_or("attention_bias", false);
  c.mlp_bias = r.boolean_or("mlp_bias", false);
  if (c.family == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q, k and v projections always have biases; o_proj none
  } else if (c.family == "mistral") {
    if (attention_bias)
      r.fail("attention_bias", j["attention_bias"], "false (Mistral's projections have none)");
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }
  if (c.family != "llama" && c.mlp_bias)
    r.fail("mlp_bias", j["mlp_bias"], "false (only llama has MLP biases)");
  c.qk_norm = c.family == "qwen3";

  // A sliding window is honoured by refusing sequences longer than it (where it applies).
  const std::int64_t window = r.integer_or("sliding_window", 0, 0, kBig);
  const bool windowed = c.family == "mistral" || r.boolean_or("use_sliding_window", false);
  if (windowed && window > 0)
    c.sliding_window = window;
  return checked(r, c);
}

DecoderConfig read_hf_config(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), path + ": cannot read the model configuration");
  std::stringstream text;
  text << in.rdbuf();
  return decoder_config_from_hf_json(text.str(), path);
}

namespace {

// GPT-2's config.json (tied head, tanh GELU); dropout 0: a Loom run sets its own.
std::string gpt2_config_json(const DecoderConfig& c) {
  nlohmann::ordered_json j{
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab},
      {"n_positions", c.context},
      {"n_embd", c.hidden},
      {"n_layer", c.layers},
      {"n_head", c.heads},
      {"n_inner", c.intermediate == 4 * c.hidden ? Json(nullptr) : Json(c.intermediate)},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", c.norm_eps},
      {"initializer_range", c.init_std},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"tie_word_embeddings", true},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

}  // namespace

std::string hf_config_json(const DecoderConfig& c) {
  if (c.gpt2())
    return gpt2_config_json(c);
  nlohmann::ordered_json j;
  static const char* const kArchitecture[][2] = {{"llama", "LlamaForCausalLM"},
                                                 {"mistral", "MistralForCausalLM"},
                                                 {"qwen2", "Qwen2ForCausalLM"},
                                                 {"qwen3", "Qwen3ForCausalLM"}};
  for (const auto& [family, architecture] : kArchitecture)
    if (c.family == family)
      j["architectures"] = {architecture};
  j["model_type"] = c.family;
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.intermediate;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.context;
  j["rms_norm_eps"] = c.norm_eps;
  j["hidden_act"] = "silu";
  j["initializer_range"] = c.init_std;
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (c.family == "llama" || c.family == "qwen3")
    j["attention_bias"] = c.qkv_bias;
  if (c.family == "llama")
    j["mlp_bias"] = c.mlp_bias;
  if (c.family == "mistral" || c.family == "qwen2")
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
  nlohmann::ordered_json rope{{"rope_theta", c.rope_theta}};
  if (c.rope_scaling == RopeScaling::none) {
    rope["rope_type"] = "default";
  } else if (c.rope_scaling == RopeScaling::linear) {
    rope["rope_type"] = "linear";
    rope["factor"] = c.rope_factor;
  } else {
    rope["rope_type"] = "llama3";
    rope["factor"] = c.rope_factor;
    rope["low_freq_factor"] = c.rope_low_freq_factor;
    rope["high_freq_factor"] = c.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_original_context;
  }
  j["rope_parameters"] = rope;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace loom::nn
