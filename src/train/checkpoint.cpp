#include "train/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/onnx_model.h"

namespace loom::train {

namespace fs = std::filesystem;

std::string ModelSpec::to_json() const {
  nlohmann::ordered_json j{{"kind", kind},       {"vocab", vocab}, {"context", context},
                           {"layers", layers},   {"heads", heads}, {"width", width},
                           {"dropout", dropout}, {"bias", bias}};
  if (!onnx.empty())
    j["onnx"] = onnx;
  return j.dump();
}

ModelSpec ModelSpec::from_json(const std::string& text, const std::string& where) {
  ModelSpec s;
  try {
    auto j = nlohmann::json::parse(text);
    s.kind = j.at("kind").get<std::string>();
    s.vocab = j.at("vocab").get<std::int64_t>();
    s.context = j.at("context").get<std::int64_t>();
    s.layers = j.at("layers").get<std::int64_t>();
    s.heads = j.at("heads").get<std::int64_t>();
    s.width = j.at("width").get<std::int64_t>();
    s.dropout = j.value("dropout", 0.0);
    s.bias = j.value("bias", true);
    s.onnx = j.value("onnx", std::string());
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": metadata loom_model is not a valid model description (" + e.what() +
                ")");
  }
  check(s.kind == "gpt" || s.kind == "mlp" || s.kind == "cnn",
        where + ": loom_model kind '" + s.kind + "' is unknown");
  return s;
}

std::unique_ptr<nn::Model> make_model(const ModelSpec& spec, std::uint64_t seed, Backend& backend) {
  if (spec.kind == "gpt") {
    nn::GptConfig c{spec.vocab, spec.context, spec.layers, spec.heads,
                    spec.width, spec.dropout, spec.bias};
    return std::make_unique<nn::Gpt>(c, seed, backend);
  }
  if (spec.kind == "onnx")
    return std::make_unique<nn::OnnxModel>(spec.onnx, backend);  // weights from the file
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

namespace {
bool is_ignorable_extra(const std::string& name) {
  // transformers' GPT2LMHeadModel state dict: the tied head and causal-mask buffers.
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

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

void load_weights(const std::string& path, nn::Model& model) {
  io::SafetensorsFile file = io::SafetensorsFile::read(path);
  for (const auto& e : file.entries()) {
    if (model.find(e.name) == nullptr && !is_ignorable_extra(e.name))
      throw Error(path + ": tensor '" + e.name + "' matches no parameter of the " + model.kind() +
                  " model");
  }
  load_into(file, model, "");
}

std::int64_t load_checkpoint(const std::string& dir, nn::Model& model, optim::AdamW& optimizer) {
  std::string model_path = dir + "/model.safetensors",
              state_path = dir + "/train_state.safetensors";
  check(fs::exists(model_path) && fs::exists(state_path),
        dir +
            ": no checkpoint to resume from (expected model.safetensors and "
            "train_state.safetensors)");
  io::SafetensorsFile weights = io::SafetensorsFile::read(model_path);
  io::SafetensorsFile state = io::SafetensorsFile::read(state_path);
  auto step_of = [](const io::SafetensorsFile& f) {
    auto it = f.metadata().find("step");
    check(it != f.metadata().end(), f.path() + ": metadata 'step' is missing");
    try {
      return std::stoll(it->second);
    } catch (const std::logic_error&) {
      throw Error(f.path() + ": metadata 'step' = '" + it->second + "' is not an integer");
    }
  };
  std::int64_t step = step_of(weights);
  check(step == step_of(state), dir + ": model.safetensors is at step " + std::to_string(step) +
                                    " but train_state.safetensors at step " +
                                    std::to_string(step_of(state)) +
                                    " (an interrupted save); cannot resume exactly");
  load_weights(model_path, model);
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
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
  auto it = state.metadata().find("optimizer_steps");
  optimizer.set_steps_taken(it != state.metadata().end() ? std::stoll(it->second) : step);
  return step;
}

LoadedModel load_model_file(const std::string& path, Backend& backend) {
  std::string file_path = fs::is_directory(path) ? path + "/model.safetensors" : path;
  io::SafetensorsFile file = io::SafetensorsFile::read(file_path);
  auto meta = file.metadata();
  check(meta.count("loom_model"),
        file_path + ": metadata 'loom_model' is missing; not a Loom checkpoint");
  LoadedModel loaded;
  loaded.spec = ModelSpec::from_json(meta["loom_model"], file_path);
  loaded.model = make_model(loaded.spec, 0, backend);
  if (meta.count("loom_vocab") && !meta["loom_vocab"].empty()) {
    std::u32string alphabet = data::decode_utf8(meta["loom_vocab"], file_path + " (loom_vocab)");
    loaded.tokenizer = data::CharTokenizer(std::vector<char32_t>(alphabet.begin(), alphabet.end()));
  }
  if (meta.count("step"))
    loaded.step = std::stoll(meta["step"]);
  load_weights(file_path, *loaded.model);
  return loaded;
}

}  // namespace loom::train
