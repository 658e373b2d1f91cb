#include "cluster/catalog/catalog.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "core/checked.h"
#include "core/error.h"

namespace loom::cluster {

YAML::Node read_yaml_file(const std::string& path) {
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw Error(path + ": cannot open (missing or unreadable)");
  } catch (const YAML::Exception& e) {
    throw Error(path + ": malformed YAML at line " + std::to_string(e.mark.line + 1) + ": " +
                e.msg);
  }
}

namespace {

// The text of a scalar field; a list or mapping in its place was a yaml-cpp exception
// ("internal error").
std::string text(const YAML::Node& entry, const std::string& field, const std::string& where) {
  const YAML::Node n = entry[field];
  check(n.IsDefined() && !n.IsNull(), where + ": field '" + field + "' is missing");
  check(n.IsScalar(),
        where + ": field '" + field + "' must be a single value, not a list or mapping");
  return n.Scalar();
}

bool flag(const YAML::Node& entry, const std::string& field, const std::string& where) {
  if (!entry[field])
    return false;
  const std::string value = text(entry, field, where);
  check(value == "true" || value == "false",
        where + ": field '" + field + "' is '" + value + "', expected true or false");
  return value == "true";
}

double number(const YAML::Node& n, const std::string& where) {
  try {
    return n.as<double>();
  } catch (const YAML::Exception&) {
    throw Error(where + ": value '" + (n.IsScalar() ? n.Scalar() : std::string("(not a scalar)")) +
                "' is not a number");
  }
}

Figure figure(const YAML::Node& entry, const std::string& field, const std::string& where) {
  std::string at = where + ": field '" + field + "'";
  const YAML::Node n = entry[field];
  check(n.IsDefined(), at + " is missing; every chip figure needs {value, source, confidence}");
  check(n.IsMap() && n["value"] && n["source"] && n["confidence"],
        at + " must be {value, source, confidence}");
  static const std::set<std::string> figure_fields{"value", "source", "confidence", "low", "high"};
  check_known_fields(n, figure_fields, at, "a figure (value, source, confidence, low, high)");
  Figure f;
  f.source = text(n, "source", at);
  f.confidence = text(n, "confidence", at);
  check(!f.source.empty(), at + ": source is empty; every figure needs a source");
  const std::string value = n["value"].IsScalar() ? n["value"].Scalar() : "";
  if (value == "unknown")
    return f;
  if (value == "unsupported") {
    f.unsupported = true;
    return f;
  }
  f.value = number(n["value"], at);
  check(std::isfinite(*f.value), at + ": value " + value + " is not a finite number");
  check(*f.value >= 0, at + ": value " + value + " is negative");
  // An estimate's bounds: both or neither, low <= value <= high.
  check(static_cast<bool>(n["low"]) == static_cast<bool>(n["high"]),
        at + ": give both low and high, or neither");
  if (n["low"]) {
    f.low = number(n["low"], at + ": low");
    f.high = number(n["high"], at + ": high");
    check(std::isfinite(*f.low) && std::isfinite(*f.high) && *f.low >= 0 && *f.low <= *f.value &&
              *f.value <= *f.high,
          at + ": expected 0 <= low <= value <= high, got low " + n["low"].Scalar() + ", value " +
              value + ", high " + n["high"].Scalar());
  }
  return f;
}

// A rate relative to a peak (gemm_efficiency, attention_efficiency): a number in (0, 1], and
// so are an estimate's bounds. `required`: "unknown" is refused too (a figure the model
// cannot do without once the field is given).
Figure rate_figure(const YAML::Node& entry, const std::string& field, const std::string& where,
                   bool required) {
  Figure f = figure(entry, field, where);
  const YAML::Node n = entry[field];
  const std::string at = where + ": field '" + field + "'";
  auto in_range = [](double v) { return v > 0 && v <= 1; };
  if ((required && !f.known()) || f.unsupported || (f.known() && !in_range(*f.value)))
    throw Error(at + ": value must be a number in (0, 1], got " + n["value"].Scalar());
  if (f.ranged() && !(in_range(*f.low) && in_range(*f.high)))
    throw Error(at + ": low and high must be numbers in (0, 1], got low " + n["low"].Scalar() +
                ", high " + n["high"].Scalar());
  return f;
}

// A scale-up domain is a chip count: the performance model and the planner use it as an
// integer, so a fraction, 0 or 1e30 (undefined behaviour when cast) is refused at load.
constexpr std::int64_t kMaxScaleupDomain = std::int64_t{1} << 20;

Figure domain_figure(const YAML::Node& entry, const std::string& where) {
  Figure f = figure(entry, "scaleup_domain", where);
  if (f.known())
    whole_number(*f.value, 1, kMaxScaleupDomain, where + ": field 'scaleup_domain'");
  return f;
}

// The largest integer a catalog field may hold: 2^53, the last one every double represents.
constexpr std::int64_t kMaxCatalogInteger = std::int64_t{1} << 53;

std::int64_t integer(const YAML::Node& entry, const std::string& field, const std::string& where,
                     bool required, std::int64_t fallback = 0) {
  const YAML::Node n = entry[field];
  if (!n.IsDefined()) {
    check(!required, where + ": field '" + field + "' is missing");
    return fallback;
  }
  const std::string at = where + ": field '" + field + "'";
  // Range-checked before the cast: casting 1e30 or .inf to int64 is undefined behaviour.
  return whole_number(number(n, at), 0, kMaxCatalogInteger, at);
}

Model parse_model(const YAML::Node& m, const std::string& file, std::size_t index) {
  std::string where = file + ": models[" + std::to_string(index) + "]";
  check(m.IsMap() && m["id"], where + " needs an id");
  const std::string id = text(m, "id", where);
  check_known_fields(m, model_field_names(), file + ": model '" + id + "'", "a model",
                     {"id", "source"});
  Model model = model_from_yaml(m, file + ": model '" + id + "'");
  model.id = id;
  model.source = m["source"] ? text(m, "source", where) : "";
  return model;
}

// The fields of a chips.yaml entry and of a systems.yaml entry.
const std::set<std::string>& chip_field_names() {
  // clang-format off
  static const std::set<std::string> names{
      "id", "name", "status", "bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_gb", "hbm_tbps",
      "scaleup_gbps", "scaleup_domain", "scaleout_gbits", "tdp_w", "price_per_hour",
      "gemm_efficiency", "attention_efficiency"};
  // clang-format on
  return names;
}
const std::set<std::string>& system_field_names() {
  static const std::set<std::string> names{"id", "name", "chip", "scaleup_domain",
                                           "scaleout_gbits"};
  return names;
}

}  // namespace

void check_known_fields(const YAML::Node& entry, const std::set<std::string>& known,
                        const std::string& where, const std::string& what,
                        const std::set<std::string>& also) {
  for (const auto& field : entry) {
    check(field.first.IsScalar(),
          where + ": a field's name is a list or mapping, expected a single word");
    const std::string name = field.first.Scalar();
    check(known.count(name) != 0 || also.count(name) != 0,
          where + ": field '" + name + "' is not a field of " + what);
  }
}

Model model_from_yaml(const YAML::Node& m, const std::string& where) {
  Model model;
  model.layers = integer(m, "layers", where, true);
  model.hidden = integer(m, "hidden", where, true);
  model.heads = integer(m, "heads", where, true);
  model.kv_heads = integer(m, "kv_heads", where, false, model.heads);
  model.ffn = integer(m, "ffn", where, false, 4 * model.hidden);
  model.vocab = integer(m, "vocab", where, true);
  model.seq = integer(m, "seq", where, false, 2048);
  model.gated = flag(m, "gated", where);
  model.experts = integer(m, "experts", where, false);
  model.top_k = integer(m, "top_k", where, false);
  model.shared_experts = integer(m, "shared_experts", where, false);
  model.expert_ffn = integer(m, "expert_ffn", where, false, model.ffn);
  model.dense_layers = integer(m, "dense_layers", where, false);
  model.dropout = flag(m, "dropout", where);
  model.q_lora_rank = integer(m, "q_lora_rank", where, false);
  model.kv_lora_rank = integer(m, "kv_lora_rank", where, false);
  model.qk_nope_dim = integer(m, "qk_nope_dim", where, false);
  model.qk_rope_dim = integer(m, "qk_rope_dim", where, false);
  model.v_head_dim = integer(m, "v_head_dim", where, false);
  model.mtp_layers = integer(m, "mtp_layers", where, false);
  model.route_nodes = integer(m, "route_nodes", where, false);
  model.head_dim = integer(m, "head_dim", where, false);
  model.validate(where);
  return model;
}

const std::set<std::string>& model_field_names() {
  // clang-format off
  static const std::set<std::string> names{
      "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "gated", "head_dim",
      "experts", "top_k", "shared_experts", "expert_ffn", "dense_layers", "route_nodes",
      "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim",
      "mtp_layers", "dropout"};
  // clang-format on
  return names;
}

double Model::attention_params() const {
  double h = static_cast<double>(hidden);
  if (mla()) {
    // q: h -> q_lora -> heads x (nope + rope) (or h -> that directly without a q latent);
    // kv: h -> kv_lora + rope (the shared rope key), kv_lora -> heads x (nope + v); out: heads x v
    // -> h.
    double a = static_cast<double>(heads), q_lora = static_cast<double>(q_lora_rank);
    double kv_lora = static_cast<double>(kv_lora_rank), qk = qk_width(), v = v_width();
    double q = q_lora > 0 ? h * q_lora + q_lora * qk : h * qk;
    double kv = h * (kv_lora + static_cast<double>(qk_rope_dim)) +
                kv_lora * a * static_cast<double>(qk_nope_dim + v_head_dim);
    return q + kv + v * h;
  }
  // q and out: h x (heads x head dim); k and v: h x (kv heads x head dim).
  const double d = static_cast<double>(head_width());
  return 2.0 * h * static_cast<double>(heads) * d + kv_projection_params();
}
double Model::kv_projection_params() const {
  if (mla())
    return 0.0;
  return 2.0 * static_cast<double>(hidden) * static_cast<double>(kv_heads) *
         static_cast<double>(head_width());
}
double Model::qk_width() const {
  return mla() ? static_cast<double>(heads * (qk_nope_dim + qk_rope_dim))
               : static_cast<double>(heads * head_width());
}
double Model::v_width() const {
  return mla() ? static_cast<double>(heads * v_head_dim)
               : static_cast<double>(heads * head_width());
}
double Model::dense_mlp_params() const {
  return (gated ? 3.0 : 2.0) * static_cast<double>(hidden) * static_cast<double>(ffn);
}
double Model::expert_params() const {
  return (gated ? 3.0 : 2.0) * static_cast<double>(hidden) * static_cast<double>(expert_ffn);
}
double Model::total_params() const {
  double dense =
      static_cast<double>(layers - moe_layers()) * (attention_params() + dense_mlp_params());
  double sparse =
      static_cast<double>(moe_layers()) *
      (attention_params() + static_cast<double>(experts + shared_experts) * expert_params());
  return dense + sparse + static_cast<double>(vocab) * static_cast<double>(hidden);
}
double Model::active_params() const {
  double dense =
      static_cast<double>(layers - moe_layers()) * (attention_params() + dense_mlp_params());
  double sparse =
      static_cast<double>(moe_layers()) *
      (attention_params() + static_cast<double>(top_k + shared_experts) * expert_params());
  return dense + sparse + static_cast<double>(vocab) * static_cast<double>(hidden);
}

void Model::validate(const std::string& where) const {
  auto positive = [&](const char* field, std::int64_t v) {
    check(v > 0, where + ": field '" + field + "': value " + std::to_string(v) + " must be > 0");
  };
  positive("layers", layers);
  positive("hidden", hidden);
  positive("heads", heads);
  positive("kv_heads", kv_heads);
  positive("ffn", ffn);
  positive("vocab", vocab);
  positive("seq", seq);
  check(hidden % heads == 0, where + ": hidden " + std::to_string(hidden) +
                                 " is not divisible by heads " + std::to_string(heads));
  check(heads % kv_heads == 0, where + ": heads " + std::to_string(heads) +
                                   " is not divisible by kv_heads " + std::to_string(kv_heads));
  if (experts > 0) {
    check(top_k >= 1 && top_k <= experts,
          where + ": top_k " + std::to_string(top_k) + " must be in 1.." + std::to_string(experts));
    check(dense_layers < layers, where + ": dense_layers must be fewer than layers");
  }
  if (kv_lora_rank > 0)
    check(qk_nope_dim > 0 && qk_rope_dim > 0 && v_head_dim > 0,
          where + ": multi-head latent attention (kv_lora_rank " + std::to_string(kv_lora_rank) +
              ") needs qk_nope_dim, qk_rope_dim and v_head_dim > 0");
}

Catalog Catalog::load(const std::string& dir) {
  return with_yaml_errors(dir, [&] {
    Catalog c;
    std::string chips_path = dir + "/chips.yaml";
    YAML::Node chips = read_yaml_file(chips_path)["chips"];
    check(chips && chips.IsSequence(), chips_path + ": expected a 'chips' list");
    std::set<std::string> ids;
    for (std::size_t i = 0; i < chips.size(); ++i) {
      const YAML::Node& e = chips[i];
      check(e.IsMap() && e["id"], chips_path + ": chips[" + std::to_string(i) + "] needs an id");
      Chip chip;
      chip.id = text(e, "id", chips_path + ": chips[" + std::to_string(i) + "]");
      check(ids.insert(chip.id).second, chips_path + ": chip id '" + chip.id + "' appears twice");
      std::string where = chips_path + ": chip '" + chip.id + "'";
      check_known_fields(e, chip_field_names(), where, "a chip");
      chip.name = e["name"] ? text(e, "name", where) : chip.id;
      chip.status = e["status"] ? text(e, "status", where) : "shipping";
      check(chip.status == "shipping" || chip.status == "roadmap",
            where + ": field 'status': value '" + chip.status + "' is not shipping or roadmap");
      chip.bf16_tflops = figure(e, "bf16_tflops", where);
      chip.fp8_tflops = figure(e, "fp8_tflops", where);
      chip.fp4_tflops = figure(e, "fp4_tflops", where);
      chip.hbm_gb = figure(e, "hbm_gb", where);
      chip.hbm_tbps = figure(e, "hbm_tbps", where);
      chip.scaleup_gbps = figure(e, "scaleup_gbps", where);
      chip.scaleup_domain = domain_figure(e, where);
      chip.scaleout_gbits = figure(e, "scaleout_gbits", where);
      chip.tdp_w = figure(e, "tdp_w", where);
      chip.price_per_hour = figure(e, "price_per_hour", where);
      chip.gemm_efficiency = rate_figure(e, "gemm_efficiency", where, false);
      if (e["attention_efficiency"]) {
        chip.attention_efficiency = rate_figure(e, "attention_efficiency", where, true);
      } else {
        chip.attention_efficiency = Figure{kFlashAttentionEfficiency,
                                           {},
                                           {},
                                           false,
                                           "assumed (no calibrated figure; see catalog.h)",
                                           "assumed"};
      }
      c.chips_.push_back(std::move(chip));
    }
    c.add_models_from(dir + "/models.yaml");
    std::string systems_path = dir + "/systems.yaml";
    if (std::error_code ec; std::filesystem::exists(systems_path, ec)) {
      YAML::Node systems = read_yaml_file(systems_path)["systems"];
      check(systems && systems.IsSequence(), systems_path + ": expected a 'systems' list");
      for (std::size_t i = 0; i < systems.size(); ++i) {
        const YAML::Node& e = systems[i];
        check(e.IsMap() && e["id"] && e["chip"],
              systems_path + ": systems[" + std::to_string(i) + "] needs id and chip");
        System sys;
        sys.id = text(e, "id", systems_path + ": systems[" + std::to_string(i) + "]");
        std::string where = systems_path + ": system '" + sys.id + "'";
        check_known_fields(e, system_field_names(), where, "a system");
        sys.name = e["name"] ? text(e, "name", where) : sys.id;
        sys.chip = text(e, "chip", where);
        try {
          c.chip(sys.chip);
        } catch (const Error& err) {
          throw Error(where + ": field 'chip': " + err.what());
        }
        sys.scaleup_domain = domain_figure(e, where);
        sys.scaleout_gbits = figure(e, "scaleout_gbits", where);
        c.systems_.push_back(std::move(sys));
      }
    }
    return c;
  });
}

void Catalog::add_models_from(const std::string& path) {
  with_yaml_errors(path, [&] {
    YAML::Node models = read_yaml_file(path)["models"];
    check(models && models.IsSequence(), path + ": expected a 'models' list");
    for (std::size_t i = 0; i < models.size(); ++i) {
      Model m = parse_model(models[i], path, i);
      for (const Model& existing : models_)
        check(existing.id != m.id, path + ": model id '" + m.id + "' is already defined");
      models_.push_back(std::move(m));
    }
  });
}

const Chip& Catalog::chip(const std::string& id) const {
  std::string known;
  for (const Chip& c : chips_) {
    if (c.id == id)
      return c;
    known += (known.empty() ? "" : ", ") + c.id;
  }
  throw Error("unknown chip '" + id + "'; the catalog has: " + known);
}

const Model& Catalog::model(const std::string& id) const {
  std::string known;
  for (const Model& m : models_) {
    if (m.id == id)
      return m;
    known += (known.empty() ? "" : ", ") + m.id;
  }
  throw Error("unknown model '" + id + "'; the catalog has: " + known +
              " (or give --layers --hidden ... or a YAML file)");
}

Chip Catalog::chip_in_system(const std::string& id) const {
  std::string known;
  for (const System& sys : systems_) {
    if (sys.id == id) {
      Chip chip = this->chip(sys.chip);
      chip.scaleup_domain = sys.scaleup_domain;
      chip.scaleout_gbits = sys.scaleout_gbits;
      chip.id = sys.chip + "@" + sys.id;
      return chip;
    }
    known += (known.empty() ? "" : ", ") + sys.id;
  }
  throw Error("unknown system '" + id + "'; the catalog has: " + known);
}

void apply_device_profile(Chip& chip, const std::string& path, const std::string& dtype) {
  std::ifstream file(path);
  check(file.good(), path + ": cannot open the device profile (missing or unreadable)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
  check(j.is_object() && j.value("format", "") == "loom-device-profile/1",
        path + ": field 'format' must be \"loom-device-profile/1\"");
  if (j.contains("chip")) {
    std::string declared = j["chip"].is_string() ? j["chip"].get<std::string>() : j["chip"].dump();
    std::string base = chip.id.substr(0, chip.id.find('@'));
    check(declared == base, path + ": field 'chip': value '" + declared +
                                "' does not match the planned chip '" + base + "'");
  }
  check(j.contains("gemm") && j["gemm"].is_array() && !j["gemm"].empty(),
        path + ": field 'gemm' must be a non-empty list");
  double best = 0;
  for (std::size_t i = 0; i < j["gemm"].size(); ++i) {
    const auto& g = j["gemm"][i];
    std::string at = path + ": gemm[" + std::to_string(i) + "]";
    check(g.is_object() && g.contains("dtype") && g.contains("tflops"),
          at + " needs dtype and tflops");
    check(g["tflops"].is_number() && g["tflops"].get<double>() > 0,
          at + ": field 'tflops': value " + g["tflops"].dump() + " is not a positive number");
    // A GEMM size that is not a number was an nlohmann type_error ("internal error").
    auto size = [&](const char* field) {
      if (!g.contains(field))
        return 0.0;
      check(g[field].is_number(),
            at + ": field '" + field + "' is " + g[field].dump() + ", expected a number");
      return g[field].get<double>();
    };
    bool large = size("m") >= 2048 && size("n") >= 2048 && size("k") >= 2048;
    if (g["dtype"] == dtype && large)
      best = std::max(best, g["tflops"].get<double>());
  }
  check(best > 0, path + ": no " + dtype + " GEMM of size >= 2048 in field 'gemm'");
  const Figure& peak = dtype == "fp8" ? chip.fp8_tflops : chip.bf16_tflops;
  check(peak.known(), path + ": the catalog has no " + dtype + " peak for " + chip.id +
                          " to relate the profile to");
  chip.gemm_efficiency = Figure{std::min(1.0, best / *peak.value), {},        {}, false,
                                "device profile " + path,          "measured"};
  if (j.contains("memory_bandwidth_gbs")) {
    check(j["memory_bandwidth_gbs"].is_number() && j["memory_bandwidth_gbs"].get<double>() > 0,
          path + ": field 'memory_bandwidth_gbs': value " + j["memory_bandwidth_gbs"].dump() +
              " is not a positive number");
    // The perf model multiplies the HBM figure by its achieved-fraction constant (0.8); a
    // measured figure is already achieved, so it is stored divided by that fraction.
    chip.hbm_tbps = Figure{j["memory_bandwidth_gbs"].get<double>() / 1000.0 / 0.8,
                           {},
                           {},
                           false,
                           "device profile " + path,
                           "measured"};
  }
}

std::int64_t scaleup_domain_chips(const Chip& chip) {
  check(chip.scaleup_domain.known(),
        chip.id + ": field 'scaleup_domain' is unknown; the plan needs the domain's chip count");
  return whole_number(*chip.scaleup_domain.value, 1, kMaxScaleupDomain,
                      chip.id + ": field 'scaleup_domain'");
}

std::string default_catalog_dir() {
  if (const char* env = std::getenv("LOOM_CATALOG"))
    return env;
  namespace fs = std::filesystem;
  // The binary lives in <repo>/build/<preset>/; the catalog in <repo>/catalog.
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path p = exe.parent_path(); !ec && !p.empty() && p != p.root_path(); p = p.parent_path())
    if (fs::exists(p / "catalog" / "chips.yaml"))
      return (p / "catalog").string();
  return "catalog";
}

}  // namespace loom::cluster
