// train/step_modes.cpp — how a step runs: eager, graph or pipeline (training_run.h).
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/devices.h"
#include "graph/graph.h"
#include "optim/adamw.h"
#include "train/prefetch.h"
#include "train/training_run.h"

namespace loom::train {

namespace ag = loom::autograd;

namespace {

// Forward and backward op by op: returns the loss, leaves gradients in the parameters.
Tensor eager_forward_backward(nn::Model& model, const data::Batch& batch,
                              const nn::ForwardOptions& options) {
  ag::Tape tape;
  ag::Var loss = ag::cross_entropy(tape, model.forward(tape, batch.inputs, options), batch.targets);
  tape.backward(loss);
  return loss.value();
}

// The gradients' mean over the data-parallel processes: all of them (all-reduce), or with
// ZeRO each process's own parameters' (reduce-scatter; the distributed optimizer).
void reduce_gradients(TrainingRun& run, dist::GradientAverager& averager) {
  if (run.sharding)
    run.sharding->reduce_scatter_gradients(run.model->parameters());
  else
    averager.average(run.model->parameters());
}

// Eager: op by op; gradients averaged among the data-parallel processes after the
// backward pass, then clipped.
class EagerStep : public StepMode {
 public:
  explicit EagerStep(TrainingRun& run) : run_(run), averager_(run.data_comm()) {}
  double run(std::int64_t step) override {
    Tensor loss =
        eager_forward_backward(*run_.model, run_.local_batch(step), run_.forward_options(step));
    reduce_gradients(run_, averager_);
    if (run_.cfg.grad_clip > 0)
      run_.clip_grad_norm(run_.cfg.grad_clip);
    return dist::mean_over_ranks(run_.data_comm(), loss.item());
  }

 private:
  TrainingRun& run_;
  dist::GradientAverager averager_;
};

// Graph mode: the first step runs eagerly while it is captured; the second replays the
// captured graph (dead nodes removed, intermediates in planned memory) and checks the
// replay against the same step run eagerly; from the third on the replay runs alone,
// with the step's batch, parameters and dropout seed. Gradients are views of the graph's
// memory until the next step. Data parallel on host memory, the all-reduce can overlap
// the backward pass: the replay hands each gradient to the communication stream as soon
// as it is final. On a device with memory of its own, the next step's batch is uploaded
// on a copy stream while this step computes (train/prefetch.h).
class GraphStep : public StepMode {
  static graph::Passes passes(const TrainConfig& cfg) { return graph::Passes::all(cfg.fuses()); }

 public:
  explicit GraphStep(TrainingRun& run)
      : run_(run), averager_(run.data_comm()), step_(passes(run.cfg)) {
    const TrainConfig& cfg = run.cfg;
    const bool overlap =
        cfg.overlap_setting() == Overlap::on ||
        (cfg.overlap_setting() == Overlap::automatic && run.data_comm().spans_machines());
    // With the distributed optimizer (ZeRO-1) each bucket is reduce-scattered to the ranks
    // that update its parameters.
    if (overlap && run.data_comm().size() > 1 && run.device.host_accessible())
      overlapped_ = std::make_unique<dist::OverlappedAverager>(
          run.data_comm(), static_cast<std::size_t>(cfg.bucket_mb * 1e6), run.sharding != nullptr);
    if (!run.device.host_accessible())
      prefetch_ = std::make_unique<BatchPrefetch>(
          run.device, [&run](std::int64_t s) { return run.local_batch(s, dispatch::host()); });
  }

  double run(std::int64_t step) override {
    data::Batch batch = prefetch_ ? prefetch_->take(step) : run_.local_batch(step);
    if (prefetch_ && step + 1 < run_.cfg.steps)
      prefetch_->issue(step + 1);  // before this step's kernels: the upload overlaps them
    Tensor loss = capture_or_replay(batch, run_.forward_options(step));
    if (overlapped_ && step_.replayed()) {
      overlapped_->finish();
      if (run_.sharding)
        run_.sharding->drop_others_gradients(run_.model->parameters());
    } else
      reduce_gradients(run_, averager_);
    if (run_.cfg.grad_clip > 0)
      run_.clip_grad_norm(run_.cfg.grad_clip);
    return dist::mean_over_ranks(run_.data_comm(), loss.item());
  }

  std::string note(std::int64_t step) const override {
    if (step == run_.start + 1 && step_.graph() != nullptr)
      return step_.graph()->summary() + ", replay checked against eager execution";
    if (step == run_.start + 2 && overlapped_)
      return std::string("graph: gradients ") +
             (run_.sharding ? "reduce-scattered to their owners" : "all-reduced") + " in " +
             std::to_string(overlapped_->buckets_last_step()) + " buckets during the backward pass";
    return {};
  }

  void summarize(Summary& summary) const override {
    const graph::Graph* g = step_.graph();
    if (g == nullptr || !step_.replayed())
      return;
    summary.graph_nodes = static_cast<std::int64_t>(g->stats().nodes);
    summary.graph_fused_chains = static_cast<std::int64_t>(g->stats().fused_chains);
    summary.graph_memory_bytes = static_cast<std::int64_t>(g->stats().memory_bytes);
    if (overlapped_)
      summary.overlapped_buckets = static_cast<std::int64_t>(overlapped_->buckets_last_step());
    if (prefetch_)
      summary.prefetched_batches = prefetch_->prefetched();
  }

 private:
  Tensor capture_or_replay(const data::Batch& batch, const nn::ForwardOptions& options) {
    std::vector<nn::Parameter>& params = run_.model->parameters();
    std::vector<Tensor> inputs{batch.inputs, batch.targets};
    for (const nn::Parameter& p : params)
      inputs.push_back(p.var.value());
    const bool capturing = step_.graph() == nullptr;
    auto eager = [&] {
      std::vector<Tensor> outputs{eager_forward_backward(*run_.model, batch, options)};
      if (capturing)
        for (std::size_t i = 0; i < params.size(); ++i)
          if (params[i].var.grad().defined())
            with_grad_.push_back(i);
      for (std::size_t i : with_grad_)
        outputs.push_back(params[i].var.grad());
      return outputs;
    };
    graph::ReplayOptions replay;
    replay.step_seed = options.dropout_seed;
    if (overlapped_)
      replay.output_ready = [&](std::size_t k) {
        if (k > 0)
          overlapped_->ready(step_.graph()->output(k),
                             run_.sharding ? run_.sharding->owner(with_grad_[k - 1]) : -1);
      };
    std::vector<Tensor> outputs = step_.run(inputs, eager, replay);
    if (capturing)
      if (const char* debug = std::getenv("LOOM_DEBUG_GRAPH"); debug != nullptr && debug[0] == '1')
        std::fprintf(stderr, "[graph] the captured step after its passes:\n%s",
                     step_.graph()->listing().c_str());
    for (std::size_t k = 0; k < with_grad_.size(); ++k)
      params[with_grad_[k]].var.state()->grad = outputs[k + 1];
    return outputs[0];
  }

  TrainingRun& run_;
  dist::GradientAverager averager_;
  std::unique_ptr<dist::OverlappedAverager> overlapped_;
  std::unique_ptr<BatchPrefetch> prefetch_;  // devices with memory of their own
  graph::CapturedStep step_;
  std::vector<std::size_t> with_grad_;  // parameters whose gradients are outputs 1, 2, ...
};

// Pipeline: the stages of a replica pass micro-batches forward and back (1F1B or GPipe);
// each stage's gradients are averaged across the replicas, then clipped over all stages.
class PipelineStep : public StepMode {
 public:
  explicit PipelineStep(TrainingRun& run) : run_(run), averager_(run.data_comm()) {}
  double run(std::int64_t step) override {
    double loss =
        run_.pipeline->forward_backward(run_.local_batch(step), run_.forward_options(step));
    reduce_gradients(run_, averager_);  // this stage's, across replicas
    if (run_.cfg.grad_clip > 0)
      run_.clip_grad_norm(run_.cfg.grad_clip);
    return dist::mean_over_ranks(run_.data_comm(), loss);
  }

 private:
  TrainingRun& run_;
  dist::GradientAverager averager_;
};

}  // namespace

std::unique_ptr<StepMode> make_step_mode(TrainingRun& run) {
  if (run.pipelined)
    return std::make_unique<PipelineStep>(run);
  if (run.cfg.execution() == ExecutionMode::graph)
    return std::make_unique<GraphStep>(run);
  return std::make_unique<EagerStep>(run);
}

}  // namespace loom::train
