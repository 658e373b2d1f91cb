#include "train/hf_folder.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dispatch/devices.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "nn/gpt.h"
#include "nn/hf_config.h"

namespace loom::train {

namespace fs = std::filesystem;

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

ModelSpec hf_model_spec(const std::string& dir) {
  return decoder_model_spec(nn::read_hf_config((fs::path(dir) / "config.json").string()));
}

ModelSpec decoder_model_spec(const nn::DecoderConfig& c) {
  ModelSpec spec;
  if (c.gpt2()) {  // Loom's gpt: its checkpoints record the sizes, which fix the rest
    const nn::DecoderConfig gpt =
        nn::gpt2_config({c.vocab, c.context, c.layers, c.heads, c.hidden});
    check(c.intermediate == gpt.intermediate && c.norm_eps == gpt.norm_eps,
          "gpt2: n_inner = " + std::to_string(c.intermediate) +
              " and layer_norm_epsilon = " + std::to_string(c.norm_eps) +
              "; Loom's gpt has n_inner = 4 n_embd and layer_norm_epsilon = 1e-5");
    spec.kind = "gpt";
    spec.vocab = c.vocab;
    spec.context = c.context;
    spec.layers = c.layers;
    spec.heads = c.heads;
    spec.width = c.hidden;
    spec.bias = true;
    return spec;
  }
  spec.kind = c.family;
  spec.vocab = c.vocab;
  spec.context = c.context;
  spec.layers = c.layers;
  spec.heads = c.heads;
  spec.width = c.hidden;
  spec.bias = c.qkv_bias || c.mlp_bias;
  spec.decoder = nn::hf_config_json(c);
  return spec;
}

namespace {

// The weight files of a folder: the shards the index names, else model.safetensors.
std::map<std::string, io::SafetensorsFile> weight_files(const fs::path& dir) {
  std::map<std::string, io::SafetensorsFile> files;
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    const fs::path single = dir / "model.safetensors";
    check(fs::exists(single, ec), dir.string() +
                                      ": no weights (expected model.safetensors or "
                                      "model.safetensors.index.json with its shards)");
    files.emplace(single.filename().string(), io::SafetensorsFile::read(single.string()));
    return files;
  }
  const std::string where = index.string();
  const nlohmann::json j = nlohmann::json::parse(io::read_whole_file(where), nullptr, false);
  check(
      !j.is_discarded() && j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
      where + ": expected a JSON object with a 'weight_map' of tensor names to files");
  for (const auto& [name, file] : j["weight_map"].items()) {
    check(file.is_string(),
          where + ": weight_map['" + name + "'] is " + file.dump() + ", expected a file name");
    const std::string shard = file.get<std::string>();
    check(
        shard.find('/') == std::string::npos && shard != ".." && !shard.empty(),
        where + ": weight_map['" + name + "'] = '" + shard + "' is not a file name in the folder");
    if (!files.count(shard))
      files.emplace(shard, io::SafetensorsFile::read((dir / shard).string()));
    check(files.at(shard).find(name) != nullptr,
          where + ": weight_map puts '" + name + "' in " + shard + ", which does not hold it");
  }
  return files;
}

}  // namespace

void load_hf_weights(const std::string& dir, nn::Model& model) {
  std::map<std::string, io::SafetensorsFile> files = weight_files(dir);
  std::map<std::string, const io::SafetensorsFile*> holder;
  for (const auto& [shard, file] : files) {
    for (const io::SafetensorsEntry& e : file.entries()) {
      if (model.find(e.name) == nullptr && !is_ignorable_extra(e.name))
        throw Error(file.path() + ": tensor '" + e.name + "' matches no parameter of the " +
                    model.kind() + " model");
      holder[e.name] = &file;
    }
  }
  for (nn::Parameter& p : model.parameters()) {
    auto it = holder.find(p.name);
    check(it != holder.end(), dir + ": tensor '" + p.name +
                                  "' is missing (the model needs it, shape " +
                                  shape_str(p.var.shape()) + ")");
    const io::SafetensorsEntry& e = *it->second->find(p.name);
    check(e.shape == p.var.shape(), it->second->path() + ": tensor '" + e.name + "' has shape " +
                                        shape_str(e.shape) + ", the model expects " +
                                        shape_str(p.var.shape()));
    p.var.set_value(it->second->load_f32(e, p.var.value().backend()));
  }
}

void export_hf(const ModelSpec& spec, nn::Model& model, const std::string& out) {
  std::string config;
  if (nn::is_decoder_family(spec.kind))
    config = nn::hf_config_json(nn::decoder_config_from_hf_json(spec.decoder, "the model"));
  else if (spec.kind == "gpt")
    config = nn::hf_config_json(
        nn::gpt2_config({spec.vocab, spec.context, spec.layers, spec.heads, spec.width}));
  else
    throw Error("export --hf: a " + spec.kind +
                " model has no Hugging Face form (gpt, llama, mistral, qwen2, qwen3 do)");
  std::error_code ec;
  fs::create_directories(out, ec);
  check(!ec, out + ": cannot create the folder: " + ec.message());
  std::vector<std::pair<std::string, Tensor>> weights;
  for (nn::Parameter& p : model.parameters())
    weights.emplace_back(p.name, p.var.value());
  io::write_safetensors((fs::path(out) / "model.safetensors").string(), weights,
                        {{"format", "pt"}});
  io::write_file_atomically((fs::path(out) / "config.json").string(), config);
}

void export_checkpoint_hf(const std::string& checkpoint, const std::string& out) {
  LoadedModel loaded = load_model_file(checkpoint, dispatch::host());
  export_hf(loaded.spec, *loaded.model, out);
  // The tokenizer the model was trained with goes along (transformers' AutoTokenizer reads it).
  std::error_code ec;
  const fs::path folder =
      fs::is_directory(checkpoint, ec) ? fs::path(checkpoint) : fs::path(checkpoint).parent_path();
  for (const char* file : {"tokenizer.json", "tokenizer.model"})
    if (fs::exists(folder / file, ec))
      io::write_file_atomically((fs::path(out) / file).string(),
                                io::read_whole_file((folder / file).string()));
}

}  // namespace loom::train
