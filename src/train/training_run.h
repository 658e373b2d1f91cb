// train/training_run.h — what a training run is made of, and the pieces its loop calls.
//
// run_training (trainer.cpp) is one short loop over pieces with one job each:
//   TrainingRun   the run's processes, data, model and optimizer, set up (or resumed) once
//   StepMode      how a step runs: eager, graph (captured once, replayed) or pipeline,
//                 with the gradient exchange among data-parallel processes that goes with it
//   Evaluation    when to estimate the validation loss, and the final evaluation
//   Checkpoints   when to write a checkpoint, and writing it (gathering sharded state first)
//   StopRule      when to stop
//   Report        progress line, metrics.jsonl and the summary
// A new way of running a step is a new StepMode; a new reason to stop is the StopRule's.
#pragma once

#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/host_stream.h"
#include "data/text.h"
#include "dist/communicator.h"
#include "dist/grid.h"
#include "dist/pipeline.h"
#include "nn/decoder.h"
#include "nn/model.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/checkpoint_store.h"
#include "train/config.h"
#include "train/progress.h"
#include "train/sharded_checkpoint.h"
#include "train/source.h"
#include "train/trainer.h"

namespace loom::train {

// A decoder family's description (model = llama | mistral | qwen2 | qwen3): the config.json
// of the Hugging Face folder the run starts from (--init DIR), else the run's keys (width,
// heads, kv_heads, ffn, layers, context, rope_theta, tie_embeddings) with the family's own
// traits; `data_vocab` tokens must fit its vocabulary.
ModelSpec decoder_spec(const TrainConfig& cfg, std::int64_t data_vocab);

// Data parallelism: each of the job's processes (mpirun -np N) trains on its share of
// every batch; gradients are averaged, so the N processes take the steps one process
// would take with the whole batch. Rank 0 alone logs, evaluates and writes. With
// tp = T and pipeline = P the processes form a grid (dist/grid.h; rank = tp + T (replica +
// R stage)): each replica's P stages (dist/pipeline.h) split its share of the batch into
// micro-batches, each stage's T ranks split its blocks (autograd/tensor_parallel.h), and the
// replicas are data parallel.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainConfig& config);
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  const TrainConfig& cfg;
  Backend& device;
  dist::Communicator& world;
  bool lead;       // rank 0: the process that reports, evaluates and writes
  bool pipelined;  // pipeline > 1
  Source source;
  ModelSpec spec;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<dist::OptimizerSharding> sharding;  // zero = 1: 1/N of AdamW's state here
  std::unique_ptr<dist::Pipeline> pipeline;
  std::int64_t start = 0;  // the first step (a resumed run's checkpoint step)
  bool resumed = false;    // started from a checkpoint (resume, or auto_resume that found one)
  double load_ms = 0;      // reading that checkpoint into the model and optimizer

  // The processes that average gradients: the world, or (tp > 1 or pipeline > 1) the grid's
  // data-parallel group of this rank (same stage, same tensor-parallel rank).
  dist::Communicator& data_comm() const { return *data_comm_; }
  // Clips the gradients to the run's global norm (a sharded gradient's squares summed over
  // its tensor-parallel group, a replicated one counted once, each at the stage that owns
  // it); returns the norm.
  double clip_grad_norm(double max_norm);
  // OUT/checkpoints/step-*, published as OUT/checkpoint (checkpoint_store.h).
  CheckpointStore& checkpoints() { return store_; }
  // This process's share of step `step`'s batch (all of it without data parallelism).
  data::Batch local_batch(std::int64_t step);
  data::Batch local_batch(std::int64_t step, Backend& backend);  // drawn on `backend`
  // Training-mode forward options of step `step` (its dropout seed).
  nn::ForwardOptions forward_options(std::int64_t step) const;
  // The optimizer step at learning rate `lr`, then the next step's zeroed gradients
  // (with ZeRO, the owners' new values go to every process).
  void update(double lr);
  // Makes the whole model present on every process (pipeline stages exchange weights and
  // moments; tensor-parallel ranks gather their slices); with `moments`, also the optimizer
  // state (ZeRO and tensor parallelism gather its shards). Before evaluating or saving;
  // release_full_state() returns to the sharded state.
  void gather_full_state(bool moments);
  void release_full_state();
  // Per parameter: whether this process keeps its optimizer moments (its stage's, and of
  // those its share under the distributed optimizer).
  std::vector<bool> kept_moments() const;
  // Test hook: with LOOM_TEST_GRADIENTS=FILE in the environment, every process gathers the
  // gradients the step just left (each parameter whole, from its stage and tensor-parallel
  // slices) and rank 0 writes them to FILE (safetensors, the parameters' names), so a test
  // compares a layout's gradients with one process's (tests/dist/test_layouts.sh). Nothing
  // when unset.
  void write_test_gradients();
  // The pieces of the training state this process writes into a sharded checkpoint
  // (sharded_checkpoint.h): each parameter and moment kept once in the job, by the first
  // process holding it (its stage's, its tensor-parallel slice's, the replica 0's or, with the
  // distributed optimizer, the moment's owner), with its place in the whole tensor.
  std::vector<ShardPiece> checkpoint_pieces() const;
  // The layout of a job of several processes, into the summary.
  void describe_layout(Summary& summary) const;

 private:
  void shard_tensor_parallel();  // after every weight and moment is loaded

  dist::Communicator* data_comm_;
  CheckpointStore store_;
  // The grid (tp > 1 or pipeline > 1); under tensor parallelism its tp group as the autograd
  // rules' group (in scope on the training thread while the run lives), the sharded
  // parameters and their dimension, and whether the moments are gathered now.
  std::unique_ptr<dist::ProcessGrid> grid_;
  std::unique_ptr<dist::TensorGroupOf> tensor_group_;
  std::unique_ptr<autograd::TensorGroupScope> tensor_scope_;
  std::vector<nn::ShardedParameter> sharded_;
  bool gathered_ = false, gathered_moments_ = false;
};

// How a step runs. After run(step) the parameters hold the clipped gradient of the whole
// batch's mean loss, exchanged among the data-parallel processes.
class StepMode {
 public:
  virtual ~StepMode() = default;
  // Forward and backward of step `step`; returns the whole batch's loss (every process).
  virtual double run(std::int64_t step) = 0;
  // A line for the log after step `step` (e.g. once a graph is captured), or empty.
  virtual std::string note(std::int64_t /*step*/) const { return {}; }
  // Adds what the mode knows to the run's summary (graph size, overlapped buckets).
  virtual void summarize(Summary& summary) const { (void)summary; }
};
// eager | graph (with the all-reduce overlapped when asked) | pipeline.
std::unique_ptr<StepMode> make_step_mode(TrainingRun& run);

// Progress line, metrics.jsonl (rank 0's) and the summary's figures.
class Report {
 public:
  explicit Report(TrainingRun& run);
  // A finished step: its loss, learning rate and wall time.
  void step(std::int64_t step, double loss, double lr, double seconds);
  // A line that stays in the log (lead process, not in --json mode).
  void message(const std::string& line);
  // One line of metrics.jsonl.
  void record(const std::string& json_line);
  void flush();
  // The summary of the steps reported (losses, median step time, throughput).
  Summary finish(std::int64_t steps);
  // Peak memory, summed over the job's processes and each rank's (a collective: every
  // process calls it).
  void measure_memory(Summary& summary);
  // Adds one step's collectives (the totals before and after it) to the run's account.
  void count_collectives(const std::vector<dist::CollectiveTotals>& before,
                         const std::vector<dist::CollectiveTotals>& after);

 private:
  TrainingRun& run_;
  Progress progress_;
  std::ofstream metrics_;  // rank 0's; writes to a closed stream do nothing
  std::vector<double> step_seconds_;
  double loss_first_ = 0, loss_last_ = 0;
  std::optional<double> resumed_loss_;  // the loss logged at the step a resumed run starts from
  std::vector<dist::CollectiveTotals> collectives_;  // summed over the steps reported
};

// Validation estimates every eval_every steps (text models) and the final evaluation.
class Evaluation {
 public:
  explicit Evaluation(TrainingRun& run);
  bool due(std::int64_t step) const;  // after step `step` (0-based)
  // The lead process's estimate over a fixed set of validation batches.
  void estimate(std::int64_t step, Report& report);
  // Full validation loss (text) or test accuracy (images), into the summary and metrics.
  void final(Summary& summary, Report& report);

 private:
  TrainingRun& run_;
  std::vector<data::Batch> val_batches_;  // fixed, so estimates at different steps compare
};

// Checkpoints every ckpt_every steps and at the end; resume reads them (TrainingRun).
class Checkpoints {
 public:
  explicit Checkpoints(TrainingRun& run);
  bool due(std::int64_t step, std::int64_t end) const;  // after step `step`, not the last
  // Writes the checkpoint of `steps_done` steps (lead process; every process gathers).
  void save(std::int64_t steps_done);
  // The end of the run: gathers the whole model (for the final evaluation too) and saves.
  void save_final(std::int64_t steps_done);
  // Each checkpoint's stall of the training thread and write time (after the last is done).
  void summarize(Summary& summary);

 private:
  void write(std::int64_t steps_done);
  // checkpoint_format = sharded: every process writes its pieces, rank 0 the index, then
  // publishes (every process calls it). In the background, the pieces are copied and the
  // writing runs on writer_ while training goes on.
  void write_sharded(std::int64_t steps_done, bool background);
  static void wait_for_shards(const std::string& folder, int ranks, std::int64_t step);
  void snapshot(std::vector<ShardPiece>& pieces);        // the pieces' values copied to snapshot_
  void copy_tokenizer(const std::string& folder) const;  // the run's tokenizer file, if any
  TrainingRun& run_;
  std::string vocab_utf8_, config_json_;
  struct SaveTiming {
    std::int64_t step = 0;
    bool background = false;
    double stall_ms = 0, wait_ms = 0, write_ms = 0;
  };
  std::deque<SaveTiming> timings_;  // a deque: the writer fills in an entry it was given
  std::vector<Tensor> snapshot_;    // host copies of the pieces a background save writes
  HostStream writer_;               // last: destroyed first, finishing what was submitted
};

// When the loop stops: after `steps`; after `stop_after` (with a checkpoint); or at the
// first step boundary after SIGTERM or SIGINT reached any of the job's processes (with a
// checkpoint, then exit code contract::ExitCode::preempted). The processes agree on that step: each
// boundary sums the processes' flags (one all-reduce of one number), so all stop after
// the same step. While a StopRule lives, a second SIGINT ends the process at once.
class StopRule {
 public:
  StopRule(const TrainConfig& cfg, dist::Communicator& world);
  ~StopRule();  // restores the previous signal handlers
  StopRule(const StopRule&) = delete;
  StopRule& operator=(const StopRule&) = delete;
  std::int64_t end() const { return end_; }  // one past the last step to run
  // Whether the loop stops before step `step` (a collective when the job has processes).
  // Test hook: with LOOM_TEST_HOLD_AT_STEP=N in the environment, a run that has taken a
  // step and reaches step N (its metrics line written) holds there until a stop signal
  // comes, so a test's SIGTERM always lands mid-run however fast the machine is; a run
  // resumed at step N does not hold again (docs/fleet.md, "Tests").
  bool reached(std::int64_t step);
  // The loop stopped for a signal: the run is preempted and resumable.
  bool preempted() const { return preempted_; }

 private:
  void hold_for_stop_signal(std::int64_t step);

  std::int64_t end_;
  std::int64_t hold_at_ = -1;     // LOOM_TEST_HOLD_AT_STEP, -1: none
  std::int64_t first_step_ = -1;  // the step this process started at
  dist::Communicator& world_;
  bool preempted_ = false;
};

// Token-weighted mean loss of `model` over `batches` (no gradients).
double mean_loss(nn::Model& model, const std::vector<data::Batch>& batches);
// The share of `test`'s images whose largest logit is their label.
double test_accuracy(nn::Model& model, const data::ImageSet& test, Backend& backend);

}  // namespace loom::train
