// train/config.h — a training run's settings. Every key can come from a YAML file or a
// `--key value` flag (flags win); every value is validated with an error naming the
// source (file or command line), the key, the value and what was expected.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/job_contract.h"
#include "dist/pipeline.h"

namespace loom::train {

// The fixed-choice settings in typed form (TrainConfig's accessors below).
enum class ExecutionMode { eager, graph };  // mode
enum class Overlap { automatic, on, off };  // overlap: auto follows the communicator

struct TrainConfig {
  // One member per key of core/job_contract.def (its type and default; the range, the
  // defaults of image models, the help text and the fleet service's reading are there too):
  // model, onnx, layers, width, heads, context, dropout, bias; data, vocab, mnist_dir; batch,
  // steps, warmup, lr, min_lr, weight_decay, beta1, beta2, grad_clip, seed; threads, device,
  // pipeline, stages, tp, micro_batches, pipeline_schedule, zero, mode, fusion, overlap, bucket_mb,
  // precision; eval_every, eval_batches, log_every, ckpt_every, keep_checkpoints,
  // checkpoint_format, checkpoint_background, out,
  // resume, auto_resume, stop_after, init, json, progress, final_eval, save.
#define LOOM_TRAIN_KEY(name, type, base, ...) LOOM_CONTRACT_CXX_##type name = base;
#include "core/job_contract.def"
#undef LOOM_TRAIN_KEY

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
  // The fixed-choice keys read as types, so no use compares text: mode, fusion, overlap,
  // precision and pipeline_schedule. The text stays the contract's record (YAML, flags,
  // checkpoints, the service); set() accepts only the contract's choices, and a value
  // written past it is refused here by key, value and choices.
  ExecutionMode execution() const;
  bool fuses() const;
  Overlap overlap_setting() const;
  DType product_dtype() const;  // the products' operand precision (set_matmul_precision)
  dist::PipelineSchedule schedule() const;
  bool sharded_checkpoints(int processes) const;  // checkpoint_format, for a job of that many
  // stages read as block counts ("3,5" -> {3, 5}; "" -> {}: even); an error names the key,
  // the value and the form expected. Their sum and number are the pipeline's to check.
  std::vector<std::int64_t> stage_counts() const;

  // Trains on text (tokens) rather than MNIST images: gpt, a decoder family, or an ONNX
  // model given text.
  bool text() const;
};

}  // namespace loom::train
