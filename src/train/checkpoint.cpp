#include "train/checkpoint.h"

#include <charconv>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "core/error.h"
#include "dispatch/devices.h"
#include "io/safetensors.h"
#include "nn/decoder.h"
#include "nn/gpt.h"
#include "nn/hf_config.h"
#include "nn/layers.h"
#include "onnx/model.h"
#include "train/sharded_checkpoint.h"

namespace loom::train {

namespace fs = std::filesystem;

std::string ModelSpec::to_json() const {
  nlohmann::ordered_json j{{"kind", kind},       {"vocab", vocab}, {"context", context},
                           {"layers", layers},   {"heads", heads}, {"width", width},
                           {"dropout", dropout}, {"bias", bias}};
  if (!onnx.empty())
    j["onnx"] = onnx;
  if (!decoder.empty())
    j["config"] = nlohmann::ordered_json::parse(decoder);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

namespace {

// An integer field of a model description in [lo, hi]: a JSON float, string or value out
// of range is named, never converted.
std::int64_t spec_integer(const nlohmann::json& j, const char* field, std::int64_t lo,
                          std::int64_t hi, const std::string& where) {
  check(j.contains(field), where + ": loom_model field '" + field + "' is missing");
  const nlohmann::json& v = j.at(field);
  check(v.is_number_integer() &&
            !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) &&
            v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi,
        where + ": loom_model field '" + field + "' is " + v.dump() + ", expected an integer in [" +
            std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v.get<std::int64_t>();
}

}  // namespace

std::int64_t metadata_integer(const std::map<std::string, std::string>& metadata,
                              const std::string& key, std::int64_t lo, std::int64_t hi,
                              const std::string& where) {
  auto it = metadata.find(key);
  check(it != metadata.end(), where + ": metadata '" + key + "' is missing");
  std::int64_t value = 0;
  const std::string& text = it->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  check(ec == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi,
        where + ": metadata '" + key + "' = '" + text + "', expected an integer in [" +
            std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return value;
}

ModelSpec ModelSpec::from_json(const std::string& text, const std::string& where) {
  ModelSpec s;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  check(j.is_object(), where + ": metadata loom_model is not a JSON object (a model description)");
  check(j.contains("kind") && j["kind"].is_string(),
        where + ": loom_model field 'kind' is missing or not a string");
  s.kind = j["kind"].get<std::string>();
  check(s.kind == "gpt" || nn::is_decoder_family(s.kind) || s.kind == "mlp" || s.kind == "cnn" ||
            s.kind == "onnx",
        where + ": loom_model kind '" + s.kind +
            "' is unknown (gpt, llama, mistral, qwen2, qwen3, mlp, cnn, onnx)");
  s.vocab = spec_integer(j, "vocab", 1, 1 << 24, where);
  s.context = spec_integer(j, "context", 1, 1 << 20, where);
  s.layers = spec_integer(j, "layers", 1, 1024, where);
  s.heads = spec_integer(j, "heads", 1, 1024, where);
  s.width = spec_integer(j, "width", 1, 65536, where);
  if (j.contains("dropout")) {
    check(j["dropout"].is_number() && j["dropout"].get<double>() >= 0 &&
              j["dropout"].get<double>() < 1,
          where + ": loom_model field 'dropout' is " + j["dropout"].dump() +
              ", expected a number in [0, 1)");
    s.dropout = j["dropout"].get<double>();
  }
  if (j.contains("bias")) {
    check(j["bias"].is_boolean(),
          where + ": loom_model field 'bias' is " + j["bias"].dump() + ", expected true or false");
    s.bias = j["bias"].get<bool>();
  }
  if (j.contains("onnx")) {
    check(j["onnx"].is_string(), where + ": loom_model field 'onnx' must be a path");
    s.onnx = j["onnx"].get<std::string>();
  }
  if (nn::is_decoder_family(s.kind)) {
    check(j.contains("config") && j["config"].is_object(),
          where + ": loom_model of kind '" + s.kind +
              "' has no field 'config' (the model's config.json)");
    s.decoder = j["config"].dump();
    nn::decoder_config_from_hf_json(s.decoder, where + " (loom_model config)");  // validates
  }
  check(s.kind != "onnx" || !s.onnx.empty(),
        where + ": loom_model kind 'onnx' names no model file (field 'onnx')");
  return s;
}

std::unique_ptr<nn::Model> make_model(const ModelSpec& spec, std::uint64_t seed, Backend& backend) {
  if (spec.kind == "gpt") {
    nn::GptConfig c{spec.vocab, spec.context, spec.layers, spec.heads,
                    spec.width, spec.dropout, spec.bias};
    return std::make_unique<nn::Gpt>(c, seed, backend);
  }
  if (nn::is_decoder_family(spec.kind))
    return std::make_unique<nn::Decoder>(
        nn::decoder_config_from_hf_json(spec.decoder, "the model's config"), seed, backend);
  if (spec.kind == "onnx")
    return std::make_unique<nn::OnnxModel>(spec.onnx, backend,
                                           dispatch::host());  // weights from the file
  if (spec.kind == "mlp") {
    nn::MlpConfig c;
    c.hidden = spec.width;
    c.depth = spec.layers;
    c.dropout = spec.dropout;
    return std::make_unique<nn::Mlp>(c, seed, backend);
  }
  nn::CnnConfig c;
  c.hidden = spec.width;
  return std::make_unique<nn::Cnn>(c, seed, backend);
}

void save_checkpoint(const std::string& dir, nn::Model& model, const ModelSpec& spec,
                     const std::string& vocab_utf8, optim::AdamW& optimizer, std::int64_t step,
                     const std::string& config_json) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec, dir + ": cannot create the checkpoint folder: " + ec.message());
  std::vector<std::pair<std::string, Tensor>> weights, state;
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    weights.emplace_back(params[i].name, params[i].var.value());
    state.emplace_back("optimizer.m." + params[i].name, optimizer.first_moments()[i]);
    state.emplace_back("optimizer.v." + params[i].name, optimizer.second_moments()[i]);
  }
  std::string step_text = std::to_string(step);
  // Train state first: a crash between the two writes leaves a model file whose step
  // disagrees, which load_checkpoint reports instead of resuming inconsistently.
  io::write_safetensors(dir + "/train_state.safetensors", state,
                        {{"step", step_text},
                         {"optimizer_steps", std::to_string(optimizer.steps_taken())},
                         {"loom_config", config_json}});
  io::write_safetensors(dir + "/model.safetensors", weights,
                        {{"format", "pt"},
                         {"step", step_text},
                         {"loom_model", spec.to_json()},
                         {"loom_vocab", vocab_utf8}});
}

bool is_ignorable_extra(const std::string& name) {
  // transformers' GPT2LMHeadModel state dict: the tied head and causal-mask buffers.
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // Older Llama checkpoints also hold each layer's rotary inverse frequencies (recomputed).
  return name == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with(".rotary_emb.inv_freq");
}

namespace {

void load_into(const io::SafetensorsFile& file, nn::Model& model, const std::string& prefix) {
  for (nn::Parameter& p : model.parameters()) {
    const io::SafetensorsEntry* e = file.find(prefix + p.name);
    check(e != nullptr, file.path() + ": tensor '" + prefix + p.name +
                            "' is missing (the model needs it, shape " + shape_str(p.var.shape()) +
                            ")");
    check(e->shape == p.var.shape(), file.path() + ": tensor '" + e->name + "' has shape " +
                                         shape_str(e->shape) + ", the model expects " +
                                         shape_str(p.var.shape()));
    p.var.set_value(file.load_f32(*e, p.var.value().backend()));
  }
}
}  // namespace

namespace {
void load_sharded_weights(const ShardedCheckpoint& c, nn::Model& model);
}  // namespace

void load_weights(const std::string& path, nn::Model& model) {
  std::error_code ec;
  if (fs::is_directory(path, ec) && is_sharded_checkpoint(path)) {
    load_sharded_weights(ShardedCheckpoint::open(path), model);
    return;
  }
  io::SafetensorsFile file = io::SafetensorsFile::read(path);
  for (const auto& e : file.entries()) {
    if (model.find(e.name) == nullptr && !is_ignorable_extra(e.name))
      throw Error(path + ": tensor '" + e.name + "' matches no parameter of the " + model.kind() +
                  " model");
  }
  load_into(file, model, "");
}

namespace {
// A parameter of `model` or one of its moments, whole, from a sharded checkpoint.
Tensor sharded_tensor(const ShardedCheckpoint& c, const std::string& name, const Shape& shape,
                      Backend& backend) {
  check(c.contains(name), c.index_path() + ": tensor '" + name +
                              "' is missing (the model needs it, shape " + shape_str(shape) + ")");
  check(c.shape(name) == shape, c.index_path() + ": tensor '" + name + "' has shape " +
                                    shape_str(c.shape(name)) + ", the model expects " +
                                    shape_str(shape));
  return c.load(name, backend);
}

void load_sharded_weights(const ShardedCheckpoint& c, nn::Model& model) {
  for (const std::string& name : c.names())
    check(name.rfind("optimizer.", 0) == 0 || model.find(name) != nullptr,
          c.index_path() + ": tensor '" + name + "' matches no parameter of the " + model.kind() +
              " model");
  for (nn::Parameter& p : model.parameters())
    p.var.set_value(sharded_tensor(c, p.name, p.var.shape(), p.var.value().backend()));
}

std::int64_t load_sharded_checkpoint(const std::string& dir, nn::Model& model,
                                     optim::AdamW& optimizer, bool weights) {
  const ShardedCheckpoint c = ShardedCheckpoint::open(dir);
  const std::int64_t step = metadata_integer(c.metadata(), "step", 0, kMaxSteps, c.index_path());
  if (weights)
    load_sharded_weights(c, model);
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!optimizer.first_moments()[i].defined())  // not kept here
      continue;
    Backend& backend = params[i].var.value().backend();
    optimizer.first_moments()[i] =
        sharded_tensor(c, "optimizer.m." + params[i].name, params[i].var.shape(), backend);
    optimizer.second_moments()[i] =
        sharded_tensor(c, "optimizer.v." + params[i].name, params[i].var.shape(), backend);
  }
  optimizer.set_steps_taken(
      metadata_integer(c.metadata(), "optimizer_steps", 0, kMaxSteps, c.index_path()));
  return step;
}
}  // namespace

std::int64_t load_checkpoint(const std::string& dir, nn::Model& model, optim::AdamW& optimizer,
                             bool weights) {
  if (is_sharded_checkpoint(dir))
    return load_sharded_checkpoint(dir, model, optimizer, weights);
  std::string model_path = dir + "/model.safetensors",
              state_path = dir + "/train_state.safetensors";
  std::error_code ec;  // a path too long or unreadable reads as missing, never throws
  check(fs::exists(model_path, ec) && fs::exists(state_path, ec),
        dir +
            ": no checkpoint to resume from (expected model.safetensors and "
            "train_state.safetensors)");
  io::SafetensorsFile model_file = io::SafetensorsFile::read(model_path);
  io::SafetensorsFile state = io::SafetensorsFile::read(state_path);
  auto step_of = [](const io::SafetensorsFile& f) {
    return metadata_integer(f.metadata(), "step", 0, kMaxSteps, f.path());
  };
  std::int64_t step = step_of(model_file);
  check(step == step_of(state), dir + ": model.safetensors is at step " + std::to_string(step) +
                                    " but train_state.safetensors at step " +
                                    std::to_string(step_of(state)) +
                                    " (an interrupted save); cannot resume exactly");
  if (weights)
    load_weights(model_path, model);
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!optimizer.first_moments()[i].defined())  // not kept here
      continue;
    for (auto [prefix, moments] : {std::pair{"optimizer.m.", &optimizer.first_moments()},
                                   std::pair{"optimizer.v.", &optimizer.second_moments()}}) {
      const io::SafetensorsEntry* e = state.find(prefix + params[i].name);
      check(e != nullptr,
            state_path + ": tensor '" + std::string(prefix) + params[i].name + "' is missing");
      check(e->shape == params[i].var.shape(),
            state_path + ": tensor '" + e->name + "' has shape " + shape_str(e->shape) +
                ", expected " + shape_str(params[i].var.shape()));
      (*moments)[i] = state.load_f32(*e, params[i].var.value().backend());
    }
  }
  optimizer.set_steps_taken(
      state.metadata().count("optimizer_steps")
          ? metadata_integer(state.metadata(), "optimizer_steps", 0, kMaxSteps, state_path)
          : step);
  return step;
}

LoadedModel load_model_file(const std::string& path, Backend& backend) {
  std::error_code ec;
  const bool sharded = fs::is_directory(path, ec) && is_sharded_checkpoint(path);
  std::optional<ShardedCheckpoint> shards;
  std::optional<io::SafetensorsFile> whole;
  std::string file_path;
  std::map<std::string, std::string> meta;
  if (sharded) {
    shards = ShardedCheckpoint::open(path);
    file_path = shards->index_path();
    meta = shards->metadata();
  } else {
    file_path = fs::is_directory(path, ec) ? path + "/model.safetensors" : path;
    whole = io::SafetensorsFile::read(file_path);
    meta = whole->metadata();
  }
  check(meta.count("loom_model"),
        file_path + ": metadata 'loom_model' is missing; not a Loom checkpoint");
  LoadedModel loaded;
  loaded.spec = ModelSpec::from_json(meta["loom_model"], file_path);
  check(loaded.spec.kind != "onnx" || fs::exists(loaded.spec.onnx, ec),
        file_path + ": the model was imported from " + loaded.spec.onnx +
            ", which is missing; the checkpoint holds its weights, the ONNX file its graph");
  loaded.model = make_model(loaded.spec, 0, backend);
  if (meta.count("loom_vocab") && !meta["loom_vocab"].empty()) {
    std::u32string alphabet = data::decode_utf8(meta["loom_vocab"], file_path + " (loom_vocab)");
    loaded.tokenizer = data::CharTokenizer(std::vector<char32_t>(alphabet.begin(), alphabet.end()));
  }
  const fs::path folder = fs::path(file_path).parent_path();
  if (fs::exists(folder / "tokenizer.json", ec) || fs::exists(folder / "tokenizer.model", ec))
    loaded.subword = data::load_tokenizer(folder.string());
  if (meta.count("step"))
    loaded.step = metadata_integer(meta, "step", 0, kMaxSteps, file_path);
  if (shards)
    load_sharded_weights(*shards, *loaded.model);
  else
    load_weights(file_path, *loaded.model);
  return loaded;
}

}  // namespace loom::train
