// train/trainer.h — the training loop and the commands built on trained models.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "train/config.h"

namespace loom::train {

struct Summary {
  std::int64_t steps = 0;
  double tokens_per_s = 0;  // tokens (GPT) or images (mlp/cnn) per second, median step
  double step_ms_median = 0;
  std::int64_t peak_rss_bytes = 0;
  double loss_first = 0, loss_last = 0;
  std::optional<double> val_loss, test_accuracy;
  // Graph mode: nodes replayed per step, bytes of planned memory for the intermediates,
  // and all-reduce buckets per step overlapped with the backward pass (data parallel).
  std::optional<std::int64_t> graph_nodes, graph_fused_chains, graph_memory_bytes,
      overlapped_buckets, prefetched_batches;
  bool lead = true;        // rank 0 of a data-parallel job (the one that reports)
  bool preempted = false;  // stopped by SIGTERM/SIGINT after a checkpoint: resumable
  std::string to_json() const;
};

// Runs training as configured (config.finalize() already called). Prints progress.
Summary run_training(const TrainConfig& config);

// Generates `tokens` characters after `prompt` from a GPT checkpoint (temperature
// sampling; temperature 0 is greedy) and returns them, without the prompt.
std::string sample_text(const std::string& checkpoint, const std::string& prompt,
                        std::int64_t tokens, double temperature, std::uint64_t seed);

// A checkpoint evaluated on data: text models (GPT, an imported language model) give the
// mean cross-entropy (nats/token) over all consecutive non-overlapping windows of the
// model's context in the UTF-8 file `data_path`; image models (MLP, CNN, an imported
// classifier) give the accuracy on MNIST's test set (`data_path`: mnist, or a folder of
// IDX files).
struct CheckpointScore {
  std::optional<double> loss, test_accuracy;
};
CheckpointScore evaluate_checkpoint(const std::string& checkpoint, const std::string& data_path,
                                    std::int64_t batch);

std::int64_t peak_rss_bytes();

}  // namespace loom::train
