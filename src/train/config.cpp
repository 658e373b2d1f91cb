#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "nn/decoder.h"
#include "train/hf_folder.h"

namespace loom::train {
namespace {

struct Field {
  std::string help;
  std::function<void(TrainConfig&, const std::string& value, const std::string& where)> set;
  std::function<nlohmann::json(const TrainConfig&)> get;
};

std::string where_of(const std::string& source, const std::string& key, const std::string& value) {
  return source + ": field '" + key + "': value '" + value + "'";
}

// The setter and getter of a member, by its type; the key's range, choices and help come
// from core/job_contract.def.
Field field_of(std::int64_t TrainConfig::*member, const contract::TrainKey& key) {
  return {std::string(key.help),
          [member, &key](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = contract::parse_integer(key, v, w);
          },
          [member](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}
Field field_of(double TrainConfig::*member, const contract::TrainKey& key) {
  return {std::string(key.help),
          [member, &key](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = contract::parse_real(key, v, w);
          },
          [member](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}
Field field_of(bool TrainConfig::*member, const contract::TrainKey& key) {
  return {std::string(key.help),
          [member](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = contract::parse_boolean(v, w);
          },
          [member](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}
Field field_of(std::string TrainConfig::*member, const contract::TrainKey& key) {
  return {std::string(key.help),
          [member, &key](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = contract::parse_text(key, v, w);
          },
          [member](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}

// Every key of core/job_contract.def, by name (so --help and the JSON list them in
// alphabetical order).
const std::map<std::string, Field>& fields() {
  static const std::map<std::string, Field> table = {
#define LOOM_TRAIN_KEY(name, ...) \
  {#name, field_of(&TrainConfig::name, *contract::find_train_key(#name))},
#include "core/job_contract.def"
#undef LOOM_TRAIN_KEY
  };
  return table;
}

}  // namespace

void TrainConfig::set(const std::string& key, const std::string& value, const std::string& source) {
  auto it = fields().find(key);
  if (it == fields().end()) {
    std::string known;
    for (const auto& [k, f] : fields())
      known += (known.empty() ? "" : ", ") + k;
    throw Error(source + ": unknown field '" + key + "'; known fields: " + known);
  }
  it->second.set(*this, value, where_of(source, key, value));
  explicitly_set.insert(key);
}

void TrainConfig::load_yaml(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw Error(path + ": cannot open the config file (missing or unreadable)");
  } catch (const YAML::Exception& e) {
    throw Error(path + ": malformed YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (root.IsNull())
    return;  // an empty file sets nothing
  check(root.IsMap(), path + ": expected a mapping of keys to values at the top level");
  for (const auto& item : root) {
    // yaml-cpp's conversion of a list, mapping or null key throws its own exception, which
    // the CLI could only report as an internal error.
    check(item.first.IsScalar(), path + ": line " + std::to_string(item.first.Mark().line + 1) +
                                     ": a key must be a field name, not a list, mapping or null");
    std::string key = item.first.Scalar();
    check(item.second.IsScalar(),
          path + ": field '" + key + "' must be a single value, not a list or mapping");
    set(key, item.second.as<std::string>(), path);
  }
}

bool TrainConfig::text() const {
  return model == "gpt" || nn::is_decoder_family(model) || (model == "onnx" && data != "mnist");
}

void TrainConfig::finalize() {
  if (is_hf_folder(init)) {
    // The folder's config.json decides the model; a different model named too is a conflict.
    const std::string family = hf_model_spec(init).kind;
    check(!explicitly_set.count("model") || model == family,
          "init: " + init + " holds a " + family + " model, but model = " + model);
    model = family;
  }
  const contract::DefaultsKind kind =
      contract::defaults_kind(model, explicitly_set.count("data") > 0, data);
  check(model != "onnx" || !onnx.empty(), "model = onnx needs --onnx FILE (an .onnx model)");
  if (kind != contract::DefaultsKind::base) {
    // Image-model defaults (core/job_contract.def), unless the user chose otherwise.
    for (const contract::TrainKey& key : contract::kTrainKeys) {
      const std::string name(key.name);
      if (const char* own = key.own_default(kind); own != nullptr && !explicitly_set.count(name)) {
        set(name, own, "defaults");
        explicitly_set.erase(name);
      }
    }
    check(data == "mnist",
          "model '" + model + "' trains on --data mnist, got data = '" + data + "'");
  } else if (model == "gpt" || nn::is_decoder_family(model)) {
    check(data != "mnist",
          "model '" + model + "' trains on text or random tokens, not data = 'mnist'");
    check(!nn::is_decoder_family(model) || dropout == 0.0,
          "dropout = " + std::to_string(dropout) + ": model '" + model +
              "' has no dropout (its families train without it)");
    check(kv_heads == 0 || heads % kv_heads == 0,
          "heads = " + std::to_string(heads) +
              " is not a multiple of kv_heads = " + std::to_string(kv_heads));
    check(width % heads == 0, "width = " + std::to_string(width) +
                                  " is not divisible by heads = " + std::to_string(heads));
  }
  check(min_lr <= lr, "min_lr = " + std::to_string(min_lr) + " exceeds lr = " + std::to_string(lr));
  check(execution() == ExecutionMode::eager || pipeline == 1,
        "mode = graph with pipeline = " + std::to_string(pipeline) +
            ": pipeline stages run eagerly for now; use mode = eager");
  const std::vector<std::int64_t> counts = stage_counts();
  check(counts.empty() || counts.size() == static_cast<std::size_t>(pipeline),
        "stages = '" + stages + "': " + std::to_string(counts.size()) + " block counts for " +
            "pipeline = " + std::to_string(pipeline) + "; expected one count per stage");
}

const std::vector<std::string>& TrainConfig::keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [k, f] : fields())
      v.push_back(k);
    return v;
  }();
  return names;
}

std::string TrainConfig::help(const std::string& key) {
  return fields().at(key).help;
}

std::string TrainConfig::to_json() const {
  nlohmann::ordered_json j;
  for (const auto& [k, f] : fields())
    j[k] = f.get(*this);
  // A value from a file may hold bytes that are not UTF-8: replaced, not thrown on.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

namespace {

// `value` read through `table`, the typed form of each of the key's choices; an error
// naming the key, the value and the contract's choices for any other text (set() refuses
// those, so only a value assigned past it reaches here). TrainConfig.TypedSettings... in
// tests/train checks that each table covers the contract's choices exactly.
template <class T>
T typed(const char* key, const std::string& value,
        std::initializer_list<std::pair<std::string_view, T>> table) {
  for (const auto& [text, typed_value] : table)
    if (value == text)
      return typed_value;
  const contract::TrainKey* spec = contract::find_train_key(key);
  throw Error(std::string(key) + " = '" + value + "': expected one of " +
              std::string(spec != nullptr ? spec->choices : std::string_view("?")));
}

}  // namespace

ExecutionMode TrainConfig::execution() const {
  return typed<ExecutionMode>("mode", mode,
                              {{"eager", ExecutionMode::eager}, {"graph", ExecutionMode::graph}});
}

bool TrainConfig::fuses() const {
  return typed<bool>("fusion", fusion, {{"true", true}, {"false", false}});
}

bool TrainConfig::sharded_checkpoints(int processes) const {
  return typed<bool>("checkpoint_format", checkpoint_format,
                     {{"auto", processes > 1}, {"whole", false}, {"sharded", true}});
}

Overlap TrainConfig::overlap_setting() const {
  return typed<Overlap>(
      "overlap", overlap,
      {{"auto", Overlap::automatic}, {"true", Overlap::on}, {"false", Overlap::off}});
}

DType TrainConfig::product_dtype() const {
  return typed<DType>("precision", precision, {{"f32", DType::f32}, {"bf16", DType::bf16}});
}

dist::PipelineSchedule TrainConfig::schedule() const {
  return typed<dist::PipelineSchedule>(
      "pipeline_schedule", pipeline_schedule,
      {{"1f1b", dist::PipelineSchedule::one_f_one_b}, {"gpipe", dist::PipelineSchedule::gpipe}});
}

std::vector<std::int64_t> TrainConfig::stage_counts() const {
  std::vector<std::int64_t> counts;
  if (stages.empty())
    return counts;
  std::size_t at = 0;
  while (at <= stages.size()) {
    const std::size_t comma = std::min(stages.find(',', at), stages.size());
    const std::string part = stages.substr(at, comma - at);
    char* end = nullptr;
    const long long n = part.empty() ? 0 : std::strtoll(part.c_str(), &end, 10);
    check(!part.empty() && *end == '\0' && n >= 1 && n <= (1 << 20),
          "stages = '" + stages + "': '" + part +
              "' is not a block count; expected positive whole numbers separated by commas, "
              "one per pipeline stage (e.g. 3,5)");
    counts.push_back(n);
    at = comma + 1;
  }
  return counts;
}

}  // namespace loom::train
