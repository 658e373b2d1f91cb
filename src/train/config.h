// train/config.h — a training run's settings. Every key can come from a YAML file or a
// `--key value` flag (flags win); every value is validated with an error naming the
// source (file or command line), the key, the value and what was expected.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace loom::train {

struct TrainConfig {
  // model
  std::string model = "gpt";  // gpt | mlp | cnn | onnx
  std::string onnx;           // model = onnx: an ONNX image classifier to import and train
  std::int64_t layers = 4, width = 128, heads = 4, context = 64;
  double dropout = 0.0;
  bool bias = true;  // gpt: false trains without Linear/LayerNorm biases (kept at zero)
  // data
  std::string data = "data/tinyshakespeare/input.txt";  // a UTF-8 text file | mnist | random
  std::int64_t vocab = 65;                              // for data = random
  std::string mnist_dir = "data/mnist";
  // optimisation (defaults: nanoGPT's shakespeare_char on CPU)
  std::int64_t batch = 12, steps = 2000, warmup = 100;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.99, grad_clip = 1.0;
  std::int64_t seed = 1337;
  // execution
  std::int64_t threads = 2;
  std::string device = "cpu";
  std::int64_t pipeline = 1;       // pipeline stages (= the job's processes); 1: data parallel
  std::int64_t micro_batches = 0;  // per step with pipeline > 1; 0: one per stage
  std::string pipeline_schedule = "1f1b";  // 1f1b | gpipe
  std::int64_t zero = 0;          // 1: data-parallel ranks shard AdamW's state (ZeRO stage 1)
  std::string mode = "eager";     // eager | graph (capture the step once, replay it)
  std::string fusion = "true";    // graph mode: fuse elementwise chains (graph/fusion.cpp)
  std::string overlap = "auto";   // graph mode, data parallel: all-reduce during the backward
                                  // pass: auto (when the processes span machines) | true | false
  double bucket_mb = 8;           // gradient bucket size for the overlapped all-reduce
  std::string precision = "f32";  // f32 | bf16 (operands of the matmul products; weights stay f32)
  // evaluation, logging, checkpoints
  std::int64_t eval_every = 250, eval_batches = 20, log_every = 10, ckpt_every = 500;
  std::int64_t keep_checkpoints = 2;  // complete checkpoints kept (checkpoint_store.h)
  std::string out = "out";
  bool resume = false;
  bool auto_resume = false;     // resume when OUT has a checkpoint, else start fresh
  std::int64_t stop_after = 0;  // stop (with a checkpoint) once this step is done; 0: run to steps
  std::string init;             // checkpoint whose weights start the run
  bool json = false;            // print one JSON summary object as the last line
  bool progress = true;         // progress bar on a terminal
  bool final_eval = true;       // full deterministic validation pass at the end
  bool save = true;             // write checkpoints (benchmarks turn this off)

  std::set<std::string> explicitly_set;  // keys given by the user (file or flag)

  // Sets `key` from its text form; `source` names where it came from (file or flag).
  void set(const std::string& key, const std::string& value, const std::string& source);
  // Loads a YAML mapping of keys to scalars.
  void load_yaml(const std::string& path);
  // Cross-field checks; applies image-model defaults for keys the user did not set.
  void finalize();
  // Every key, for help text and for `--key` flags.
  static const std::vector<std::string>& keys();
  static std::string help(const std::string& key);
  std::string to_json() const;
  // Trains on text (tokens) rather than MNIST images: gpt, or an ONNX model given text.
  bool text() const { return model == "gpt" || (model == "onnx" && data != "mnist"); }
};

}  // namespace loom::train
