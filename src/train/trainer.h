// train/trainer.h — the training loop and the commands built on trained models.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/model.h"
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
  // A job of several processes: the layout it ran (blocks per pipeline stage; micro-batches
  // per step of each replica's pipeline).
  struct Layout {
    std::int64_t tp = 1, pp = 1, dp = 1, micro_batches = 1, zero = 0;
    std::vector<std::int64_t> stage_blocks;
  };
  std::optional<Layout> layout;
  // Jobs of several processes, rank 0's view: per training step (forward, backward,
  // gradient exchange and update; not evaluation or checkpoints), each kind of collective's
  // calls, megabytes and milliseconds, and the milliseconds spent behind compute (the
  // overlapped averager's communication thread); and each rank's peak memory.
  struct Collective {
    std::string kind;
    double calls = 0, megabytes = 0, ms = 0, overlapped_ms = 0;
  };
  std::vector<Collective> collectives_per_step;
  std::vector<std::int64_t> peak_rss_bytes_per_rank;
  // Each checkpoint saved: its step, whether written in the background, the milliseconds
  // the training thread stalled for it (of which waiting for the previous background save
  // to finish: wait_ms) and the milliseconds its writing took (rank 0's: its shard, then
  // every rank's awaited, the index and the publishing).
  struct CheckpointSave {
    std::int64_t step = 0;
    bool background = false;
    double stall_ms = 0, wait_ms = 0, write_ms = 0;
  };
  std::vector<CheckpointSave> checkpoint_saves;
  std::optional<double> checkpoint_load_ms;  // a resumed run: reading its checkpoint
  bool lead = true;                          // rank 0 of a data-parallel job (the one that reports)
  bool preempted = false;  // stopped by SIGTERM/SIGINT after a checkpoint: resumable
  std::string to_json() const;
};

// Runs training as configured (config.finalize() already called). Prints progress.
Summary run_training(const TrainConfig& config);

// How tokens are drawn from a text model's next-token distribution.
struct SampleOptions {
  std::int64_t tokens = 500;  // at most this many new tokens
  double temperature = 0.8;   // 0: greedy (the most likely token)
  double top_p = 1.0;         // nucleus: draw among the most likely tokens holding this mass
  std::uint64_t seed = 1337;
  std::int32_t eos = -1;  // stop after generating this token (-1: none)
};

// Continues `prompt` (token ids, at least one) from `model`: the decoder families keep a KV
// cache, so each new token costs one position (when the cache reaches the model's context it
// restarts from the last half context); other text models rerun their last `context` tokens.
// Returns the new tokens only.
std::vector<std::int32_t> generate(nn::Model& model, std::vector<std::int32_t> prompt,
                                   std::int64_t context, const SampleOptions& options,
                                   Backend& device);

// Generates text after `prompt` from a text model's checkpoint and returns it, without the
// prompt.
std::string sample_text(const std::string& checkpoint, const std::string& prompt,
                        const SampleOptions& options);

// A checkpoint evaluated on data: text models (GPT, the decoder families, an imported
// language model) give the mean cross-entropy (nats/token) over all consecutive
// non-overlapping windows of the model's context in the UTF-8 file or indexed corpus
// `data_path`, and bits per byte; image models (MLP, CNN, an imported
// classifier) give the accuracy on MNIST's test set (`data_path`: mnist, or a folder of
// IDX files).
struct CheckpointScore {
  std::optional<double> loss, test_accuracy;
  std::optional<double> bits_per_byte;  // text models, when the data's bytes are known
};
CheckpointScore evaluate_checkpoint(const std::string& checkpoint, const std::string& data_path,
                                    std::int64_t batch);

std::int64_t peak_rss_bytes();

}  // namespace loom::train
