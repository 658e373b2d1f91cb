#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

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

std::int64_t parse_int(const std::string& value, const std::string& where, std::int64_t min,
                       std::int64_t max) {
  std::int64_t out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  check(ec == std::errc() && ptr == value.data() + value.size(), where + " is not an integer");
  check(out >= min && out <= max,
        where + " is out of range; expected " + std::to_string(min) + " to " + std::to_string(max));
  return out;
}

double parse_double(const std::string& value, const std::string& where, double min, double max) {
  double out = 0;
  try {
    std::size_t used = 0;
    out = std::stod(value, &used);
    check(used == value.size(), where + " is not a number");
  } catch (const std::logic_error&) {
    throw Error(where + " is not a number");
  }
  check(out >= min && out <= max,
        where + " is out of range; expected " + std::to_string(min) + " to " + std::to_string(max));
  return out;
}

bool parse_bool(const std::string& value, const std::string& where) {
  if (value == "true" || value == "1" || value == "yes" || value == "on")
    return true;
  if (value == "false" || value == "0" || value == "no" || value == "off")
    return false;
  throw Error(where + " is not a boolean; expected true or false");
}

constexpr std::int64_t kBig = std::int64_t{1} << 40;

Field int_field(std::int64_t TrainConfig::*member, std::int64_t min, std::int64_t max,
                std::string help) {
  return {std::move(help),
          [=](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = parse_int(v, w, min, max);
          },
          [=](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}
Field double_field(double TrainConfig::*member, double min, double max, std::string help) {
  return {std::move(help),
          [=](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = parse_double(v, w, min, max);
          },
          [=](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}
Field bool_field(bool TrainConfig::*member, std::string help) {
  return {std::move(help),
          [=](TrainConfig& c, const std::string& v, const std::string& w) {
            c.*member = parse_bool(v, w);
          },
          [=](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}
Field string_field(std::string TrainConfig::*member, std::vector<std::string> allowed,
                   std::string help) {
  return {std::move(help),
          [=](TrainConfig& c, const std::string& v, const std::string& w) {
            if (!allowed.empty()) {
              bool ok = false;
              std::string list;
              for (const auto& a : allowed) {
                ok = ok || a == v;
                list += (list.empty() ? "" : ", ") + a;
              }
              check(ok, w + " is not one of: " + list);
            }
            c.*member = v;
          },
          [=](const TrainConfig& c) { return nlohmann::json(c.*member); }};
}

const std::map<std::string, Field>& fields() {
  static const std::map<std::string, Field> table = {
      {"model", string_field(&TrainConfig::model, {"gpt", "mlp", "cnn", "onnx"},
                             "model: gpt | mlp | cnn | onnx (an imported ONNX file, --onnx)")},
      {"onnx", string_field(&TrainConfig::onnx, {},
                            "model = onnx: the .onnx file (an image classifier trained on MNIST; "
                            "its float initializers are the parameters)")},
      {"layers",
       int_field(&TrainConfig::layers, 1, 1024, "transformer blocks (gpt); hidden layers (mlp)")},
      {"width",
       int_field(&TrainConfig::width, 1, 65536, "embedding width (gpt); hidden width (mlp)")},
      {"heads", int_field(&TrainConfig::heads, 1, 1024, "attention heads (must divide width)")},
      {"context", int_field(&TrainConfig::context, 1, 1 << 20, "context length in tokens")},
      {"dropout", double_field(&TrainConfig::dropout, 0.0, 0.99, "dropout probability")},
      {"bias",
       bool_field(&TrainConfig::bias,
                  "gpt: train Linear and LayerNorm biases (false: zero, as nanoGPT's bias=False)")},
      {"data", string_field(&TrainConfig::data, {}, "a UTF-8 text file, 'mnist' or 'random'")},
      {"vocab", int_field(&TrainConfig::vocab, 1, 1 << 24, "vocabulary size for --data random")},
      {"mnist_dir",
       string_field(&TrainConfig::mnist_dir, {}, "folder with the MNIST IDX .gz files")},
      {"batch", int_field(&TrainConfig::batch, 1, 1 << 20, "sequences (or images) per step")},
      {"steps", int_field(&TrainConfig::steps, 1, kBig, "optimizer steps")},
      {"warmup", int_field(&TrainConfig::warmup, 0, kBig, "linear warmup steps")},
      {"lr", double_field(&TrainConfig::lr, 0.0, 10.0, "peak learning rate")},
      {"min_lr", double_field(&TrainConfig::min_lr, 0.0, 10.0,
                              "learning rate at the end of the cosine decay")},
      {"weight_decay",
       double_field(&TrainConfig::weight_decay, 0.0, 10.0, "AdamW decoupled weight decay")},
      {"beta1", double_field(&TrainConfig::beta1, 0.0, 0.999999, "AdamW beta1")},
      {"beta2", double_field(&TrainConfig::beta2, 0.0, 0.999999, "AdamW beta2")},
      {"grad_clip",
       double_field(&TrainConfig::grad_clip, 0.0, 1e9, "max global gradient norm (0: off)")},
      {"seed", int_field(&TrainConfig::seed, 0, kBig, "random seed (weights, batches, dropout)")},
      {"threads", int_field(&TrainConfig::threads, 1, 1024, "CPU threads")},
      {"device", string_field(&TrainConfig::device, {"cpu", "partial", "opencl", "cuda"},
                              "device to train on: cpu, partial (a backend with 10 native ops), "
                              "opencl or cuda (when built and a device is present)")},
      {"pipeline",
       int_field(&TrainConfig::pipeline, 1, 1024,
                 "pipeline stages: the GPT split across this many processes per "
                 "replica (mpirun -np P x replicas); 1: all processes are data parallel")},
      {"micro_batches",
       int_field(&TrainConfig::micro_batches, 0, 1 << 20,
                 "micro-batches per step in a pipeline (0: one per stage); must divide batch")},
      {"pipeline_schedule",
       string_field(&TrainConfig::pipeline_schedule, {"1f1b", "gpipe"},
                    "pipeline schedule: 1f1b (one forward, one backward: stage s holds at most "
                    "S - s micro-batches) or gpipe (all forwards, then all backwards); the same "
                    "numbers")},
      {"zero", int_field(&TrainConfig::zero, 0, 1,
                         "1: data-parallel processes each keep and update 1/N of the optimizer "
                         "state (ZeRO stage 1)")},
      {"mode", string_field(&TrainConfig::mode, {"eager", "graph"},
                            "execution: eager (op by op) or graph (the first step is captured, "
                            "then replayed with dead nodes removed and planned memory; the same "
                            "numbers)")},
      {"fusion", string_field(&TrainConfig::fusion, {"true", "false"},
                              "graph mode: fuse each chain of elementwise ops into one pass over "
                              "memory (false: replay the captured ops one by one)")},
      {"overlap", string_field(&TrainConfig::overlap, {"auto", "true", "false"},
                               "graph mode with data parallelism: all-reduce gradient buckets on a "
                               "communication thread while the backward pass goes on; auto: when "
                               "the processes span machines (on one machine the copies take the "
                               "cores the compute needs)")},
      {"bucket_mb", double_field(&TrainConfig::bucket_mb, 0.001, 1e6,
                                 "MB of gradients per all-reduce when overlapping")},
      {"precision", string_field(&TrainConfig::precision, {"f32", "bf16"},
                                 "matmul operands: f32, or bf16 with f32 accumulation (weights, "
                                 "activations and optimizer state stay f32)")},
      {"eval_every", int_field(&TrainConfig::eval_every, 0, kBig,
                               "steps between validation estimates (0: never)")},
      {"eval_batches",
       int_field(&TrainConfig::eval_batches, 1, kBig, "batches per validation estimate")},
      {"log_every",
       int_field(&TrainConfig::log_every, 1, kBig, "steps between log lines (no terminal)")},
      {"ckpt_every", int_field(&TrainConfig::ckpt_every, 0, kBig,
                               "steps between checkpoints (0: only at the end)")},
      {"keep_checkpoints",
       int_field(&TrainConfig::keep_checkpoints, 1, 1000,
                 "complete checkpoints kept in OUT/checkpoints (the newest is OUT/checkpoint)")},
      {"out", string_field(&TrainConfig::out, {}, "output folder: checkpoint, metrics.jsonl")},
      {"resume", bool_field(&TrainConfig::resume, "resume from the checkpoint in --out")},
      {"auto_resume",
       bool_field(&TrainConfig::auto_resume,
                  "resume from the newest checkpoint in --out if there is one, else start at "
                  "step 0 (for schedulers that restart jobs)")},
      {"stop_after", int_field(&TrainConfig::stop_after, 0, kBig,
                               "stop with a checkpoint after this step (0: run to --steps)")},
      {"init",
       string_field(&TrainConfig::init, {}, "safetensors file whose weights start the run")},
      {"json", bool_field(&TrainConfig::json, "print a JSON summary as the last line")},
      {"progress", bool_field(&TrainConfig::progress, "progress bar on a terminal")},
      {"final_eval",
       bool_field(&TrainConfig::final_eval,
                  "full pass at the end: validation loss (text), test accuracy (images)")},
      {"save",
       bool_field(&TrainConfig::save, "write checkpoints (false: none, e.g. for benchmarks)")},
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

void TrainConfig::finalize() {
  // An ONNX model trains on MNIST unless given text (--data FILE or random).
  const bool images = model == "mlp" || model == "cnn" ||
                      (model == "onnx" && (!explicitly_set.count("data") || data == "mnist"));
  check(model != "onnx" || !onnx.empty(), "model = onnx needs --onnx FILE (an .onnx model)");
  if (images) {
    // Image-model defaults, unless the user chose otherwise.
    auto fallback = [&](const std::string& key, const std::string& value) {
      if (!explicitly_set.count(key)) {
        set(key, value, "defaults");
        explicitly_set.erase(key);
      }
    };
    fallback("data", "mnist");
    fallback("batch", "64");
    fallback("steps", model == "cnn" ? "1600" : "3200");
    fallback("warmup", "0");
    fallback("weight_decay", "0");
    fallback("grad_clip", "0");
    fallback("width", model == "cnn" ? "128" : "512");
    fallback("layers", "2");
    fallback("dropout", model == "mlp" ? "0.2" : "0");
    fallback("eval_every", "0");
    fallback("ckpt_every", "0");
    check(data == "mnist",
          "model '" + model + "' trains on --data mnist, got data = '" + data + "'");
  } else if (model == "gpt") {
    check(data != "mnist", "model 'gpt' trains on text or random tokens, not data = 'mnist'");
    check(width % heads == 0, "width = " + std::to_string(width) +
                                  " is not divisible by heads = " + std::to_string(heads));
  }
  check(min_lr <= lr, "min_lr = " + std::to_string(min_lr) + " exceeds lr = " + std::to_string(lr));
  check(mode == "eager" || pipeline == 1,
        "mode = graph with pipeline = " + std::to_string(pipeline) +
            ": pipeline stages run eagerly for now; use mode = eager");
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

}  // namespace loom::train
