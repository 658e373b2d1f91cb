#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>

#include "autograd/functions.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "data/idx.h"
#include "data/text.h"
#include "dispatch/devices.h"
#include "dist/communicator.h"
#include "dist/pipeline.h"
#include "graph/graph.h"
#include "nn/init.h"
#include "nn/onnx_model.h"
#include "train/checkpoint.h"
#include "train/progress.h"

namespace loom::train {

namespace ag = loom::autograd;
namespace fs = std::filesystem;

std::int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string Summary::to_json() const {
  nlohmann::ordered_json j{{"steps", steps},
                           {"tokens_per_s", tokens_per_s},
                           {"step_ms_median", step_ms_median},
                           {"peak_rss_bytes", peak_rss_bytes},
                           {"loss_first", loss_first},
                           {"loss_last", loss_last}};
  if (val_loss)
    j["val_loss"] = *val_loss;
  if (test_accuracy)
    j["test_accuracy"] = *test_accuracy;
  if (graph_nodes)
    j["graph_nodes"] = *graph_nodes;
  if (graph_memory_bytes)
    j["graph_memory_bytes"] = *graph_memory_bytes;
  if (overlapped_buckets)
    j["overlapped_buckets"] = *overlapped_buckets;
  return j.dump();
}

namespace {

// The training data and how to draw step `s`'s batch from it, deterministically.
class Source {
 public:
  explicit Source(const TrainConfig& cfg) : cfg_(cfg) {
    if (cfg.text()) {
      text_ = cfg.data == "random" ? data::TextDataset::random(cfg.vocab, 1'000'000,
                                                               static_cast<std::uint64_t>(cfg.seed))
                                   : data::TextDataset::load(cfg.data);
      return;
    }
    const std::string& dir = cfg.mnist_dir;
    train_ = data::load_idx(dir + "/train10k-images-idx3-ubyte.gz",
                            dir + "/train10k-labels-idx1-ubyte.gz");
    test_ = data::load_idx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
    data::normalize_mnist(train_);
    data::normalize_mnist(test_);
  }

  bool text() const { return cfg_.text(); }
  const data::TextDataset& dataset() const { return text_; }
  std::int64_t vocab() const { return text() ? text_.vocab() : 10; }
  std::int64_t items_per_step() const { return text() ? cfg_.batch * cfg_.context : cfg_.batch; }

  data::Batch batch(std::int64_t step, Backend& backend) {
    auto seed = static_cast<std::uint64_t>(cfg_.seed);
    if (text())
      return text_.sample(text_.train(), cfg_.batch, cfg_.context, nn::mix_seed(seed, step),
                          backend);
    // Images: shuffled epochs; the permutation depends only on (seed, epoch).
    std::int64_t per_epoch = train_.count / cfg_.batch;
    check(per_epoch > 0, "batch = " + std::to_string(cfg_.batch) + " exceeds the " +
                             std::to_string(train_.count) + " training images");
    std::int64_t epoch = step / per_epoch;
    if (epoch != epoch_) {
      order_.resize(train_.count);
      std::iota(order_.begin(), order_.end(), 0);
      nn::Rng rng(nn::mix_seed(seed ^ 0x5eed, epoch));
      for (std::int64_t i = train_.count - 1; i > 0; --i)
        std::swap(order_[i], order_[rng.next() % static_cast<std::uint64_t>(i + 1)]);
      epoch_ = epoch;
    }
    return data::image_batch(train_, order_, (step % per_epoch) * cfg_.batch, cfg_.batch, backend);
  }

  const data::ImageSet& test_set() const { return test_; }

 private:
  const TrainConfig& cfg_;
  data::TextDataset text_;
  data::ImageSet train_, test_;
  std::vector<std::int64_t> order_;
  std::int64_t epoch_ = -1;
};

double batch_loss(nn::Model& model, const data::Batch& b) {
  ag::Tape tape;
  tape.set_recording(false);
  ag::Var logits = model.forward(tape, b.inputs, {});
  return ag::cross_entropy(tape, logits, b.targets).value().item();
}

// Token-weighted mean loss over a list of batches.
double mean_loss(nn::Model& model, const std::vector<data::Batch>& batches) {
  double total = 0.0;
  std::int64_t count = 0;
  for (const auto& b : batches) {
    total += batch_loss(model, b) * static_cast<double>(b.targets.numel());
    count += b.targets.numel();
  }
  return count > 0 ? total / static_cast<double>(count) : 0.0;
}

double test_accuracy(nn::Model& model, const data::ImageSet& test, Backend& backend) {
  std::vector<std::int64_t> order(test.count);
  std::iota(order.begin(), order.end(), 0);
  std::int64_t correct = 0;
  for (std::int64_t first = 0; first < test.count; first += 500) {
    std::int64_t n = std::min<std::int64_t>(500, test.count - first);
    data::Batch b = data::image_batch(test, order, first, n, backend);
    ag::Tape tape;
    tape.set_recording(false);
    std::vector<float> logits = model.forward(tape, b.inputs, {}).value().to_floats();
    std::vector<std::int32_t> labels = b.targets.to_ints();
    std::int64_t classes = static_cast<std::int64_t>(logits.size()) / n;
    for (std::int64_t i = 0; i < n; ++i) {
      auto row = logits.begin() + i * classes;
      correct += (std::max_element(row, row + classes) - row) == labels[i];
    }
  }
  return static_cast<double>(correct) / static_cast<double>(test.count);
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0.0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// This process's share of a batch: rows [rank B/N, (rank+1) B/N) of the inputs and the
// matching targets (a view; dispatch makes it contiguous where a kernel needs it).
data::Batch shard(data::Batch batch, const dist::Communicator& comm) {
  if (comm.size() == 1)
    return batch;
  std::int64_t rows = batch.inputs.dim(0) / comm.size(), first = comm.rank() * rows;
  std::int64_t per_row = batch.targets.numel() / batch.inputs.dim(0);
  return {batch.inputs.slice(0, first, first + rows),
          batch.targets.slice(0, first * per_row, (first + rows) * per_row)};
}

// Forward and backward op by op: returns the loss, leaves gradients in the parameters.
Tensor eager_step(nn::Model& model, const data::Batch& batch, const nn::ForwardOptions& options) {
  ag::Tape tape;
  ag::Var loss = ag::cross_entropy(tape, model.forward(tape, batch.inputs, options), batch.targets);
  tape.backward(loss);
  return loss.value();
}

// The same step in graph mode: the first call runs it eagerly while capturing it; later
// calls replay the captured graph (dead nodes removed, intermediates in planned memory)
// with this step's batch, parameters and dropout seed. Gradients are views of the
// graph's memory until the next step.
class GraphStep {
 public:
  // `grad_ready`, if given, receives each gradient during a replay as soon as it is final.
  Tensor run(nn::Model& model, const data::Batch& batch, const nn::ForwardOptions& options,
             const std::function<void(const Tensor&)>& grad_ready = nullptr) {
    std::vector<nn::Parameter>& params = model.parameters();
    std::vector<Tensor> inputs{batch.inputs, batch.targets};
    for (const nn::Parameter& p : params)
      inputs.push_back(p.var.value());
    const bool capturing = step_.graph() == nullptr;
    auto eager = [&] {
      std::vector<Tensor> outputs{eager_step(model, batch, options)};
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
    if (grad_ready)
      replay.output_ready = [&](std::size_t k) {
        if (k > 0)
          grad_ready(step_.graph()->output(k));
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
  // The last run() replayed the graph alone (gradients were handed to grad_ready).
  bool replayed() const { return step_.replayed(); }
  std::string summary() const {
    return step_.graph() != nullptr ? step_.graph()->summary() : "graph: not captured";
  }
  const graph::Graph* graph() const { return step_.graph(); }

 private:
  graph::CapturedStep step_;
  std::vector<std::size_t> with_grad_;  // parameters whose gradients are outputs 1, 2, ...
};

}  // namespace

Summary run_training(const TrainConfig& cfg) {
  cpu::set_num_threads(static_cast<int>(cfg.threads));
  Backend& device = dispatch::device(cfg.device);
  // The CPU's kernels also run the partial backend and every fallback: reset them first.
  cpu::backend().set_matmul_precision(DType::f32);
  check(device.set_matmul_precision(cfg.precision == "bf16" ? DType::bf16 : DType::f32),
        "precision: '" + cfg.precision + "' is not supported on device '" + cfg.device + "'");
  Source source(cfg);
  ModelSpec spec{cfg.model, source.vocab(), cfg.context, cfg.layers, cfg.heads,
                 cfg.width, cfg.dropout,    cfg.bias,    cfg.onnx};
  // Data parallelism: each of the job's processes (mpirun -np N) trains on its share of
  // every batch; gradients are averaged, so the N processes take the steps one process
  // would take with the whole batch. Rank 0 alone logs, evaluates and writes.
  // With pipeline = P the processes form replicas of P pipeline stages each
  // (dist/pipeline.h; rank = replica * P + stage): the replicas are data parallel, the
  // stages of one replica split its share of the batch into micro-batches.
  dist::Communicator& comm = dist::world();
  const bool lead = comm.rank() == 0;
  const bool pipelined = cfg.pipeline > 1;
  std::unique_ptr<dist::Communicator> stages_of_replica, replicas_of_stage;
  dist::Communicator* data_comm = &comm;  // the processes that average gradients
  if (pipelined) {
    check(comm.size() % cfg.pipeline == 0,
          "pipeline = " + std::to_string(cfg.pipeline) + " needs a multiple of " +
              std::to_string(cfg.pipeline) + " processes (mpirun -np " +
              std::to_string(cfg.pipeline) + " x replicas), this job has " +
              std::to_string(comm.size()));
    check(cfg.model == "gpt",
          "pipeline: only the gpt model is split into stages, not " + cfg.model);
    const int replica = comm.rank() / static_cast<int>(cfg.pipeline);
    const int stage = comm.rank() % static_cast<int>(cfg.pipeline);
    stages_of_replica = comm.split(replica, stage);
    replicas_of_stage = comm.split(stage, replica);
    data_comm = replicas_of_stage.get();
  }
  check(cfg.batch % data_comm->size() == 0,
        "batch = " + std::to_string(cfg.batch) + " does not divide among the " +
            std::to_string(data_comm->size()) + " data-parallel " +
            (pipelined ? "replicas" : "processes"));
  std::unique_ptr<nn::Model> model = make_model(spec, static_cast<std::uint64_t>(cfg.seed), device);
  if (auto* imported = dynamic_cast<nn::OnnxModel*>(model.get())) {
    const bool tokens = imported->graph().inputs.front().dtype != DType::f32;
    check(cfg.mode != "graph" || imported->capturable(),
          cfg.onnx +
              ": mode = graph: the model reads its integer inputs on the host, which a "
              "captured step cannot replay; use mode = eager");
    check(tokens == source.text(), cfg.onnx + ": the model takes " +
                                       (tokens ? "token ids" : "float images") +
                                       (source.text() ? ", not text (data = " + cfg.data + ")"
                                                      : ", not MNIST images; give --data FILE"));
  }
  if (!cfg.init.empty())
    load_weights(cfg.init, *model);
  optim::AdamW optimizer(model->parameters(), {cfg.beta1, cfg.beta2, 1e-8, cfg.weight_decay});
  const std::string ckpt_dir = cfg.out + "/checkpoint";
  std::int64_t start = cfg.resume ? load_checkpoint(ckpt_dir, *model, optimizer) : 0;
  {
    std::vector<nn::Parameter> params = model->parameters();
    dist::broadcast_parameters(comm, params);
  }
  std::unique_ptr<dist::OptimizerSharding>
      sharding;  // zero = 1: each rank keeps 1/N of AdamW's state
  if (cfg.zero == 1 && comm.size() > 1) {
    check(!pipelined,
          "zero = 1 shards the optimizer of data-parallel processes, not pipeline stages");
    sharding = std::make_unique<dist::OptimizerSharding>(comm, model->parameters());
    optimizer.keep_only(sharding->owned_here());
  }
  dist::GradientAverager averager(*data_comm);
  std::unique_ptr<dist::GptPipeline> pipeline;
  if (pipelined)
    pipeline = std::make_unique<dist::GptPipeline>(
        *stages_of_replica, dynamic_cast<nn::Gpt&>(*model),
        cfg.micro_batches > 0 ? cfg.micro_batches : cfg.pipeline,
        cfg.pipeline_schedule == "gpipe" ? dist::PipelineSchedule::gpipe
                                         : dist::PipelineSchedule::one_f_one_b);
  check(start <= cfg.steps, ckpt_dir + ": checkpoint is at step " + std::to_string(start) +
                                ", beyond steps = " + std::to_string(cfg.steps));
  std::error_code ec;
  fs::create_directories(cfg.out, ec);
  check(!ec, cfg.out + ": cannot create the output folder: " + ec.message());
  std::ofstream metrics;  // rank 0's; writes to a closed stream do nothing
  if (lead) {
    metrics.open(cfg.out + "/metrics.jsonl", cfg.resume ? std::ios::app : std::ios::trunc);
    check(metrics.good(), cfg.out + "/metrics.jsonl: cannot open for writing");
  }
  const std::string vocab_utf8 =
      source.text() && cfg.data != "random" ? source.dataset().tokenizer().alphabet_utf8() : "";
  const std::string config_json = cfg.to_json();
  const std::string unit = source.text() ? "tok" : "img";

  if (!cfg.json && lead) {
    std::printf(
        "loom: training %s (%lld parameters) on %s, %lld steps from step %lld, %lld threads\n",
        cfg.model.c_str(), static_cast<long long>(model->parameter_count()),
        source.text() ? source.dataset().source().c_str() : "mnist",
        static_cast<long long>(cfg.steps), static_cast<long long>(start),
        static_cast<long long>(cfg.threads));
  }
  // A fixed set of validation batches, so estimates at different steps compare.
  std::vector<data::Batch> val_batches;
  if (source.text() && cfg.eval_every > 0 && lead) {
    for (std::int64_t i = 0; i < cfg.eval_batches; ++i)
      val_batches.push_back(source.dataset().sample(
          source.dataset().val(), cfg.batch, cfg.context,
          nn::mix_seed(static_cast<std::uint64_t>(cfg.seed) ^ 0xe7a1, i), device));
  }

  const bool graph_mode = cfg.mode == "graph";
  GraphStep graph_step;
  // Graph mode, data parallel, host memory: gradients are all-reduced in buckets on a
  // communication thread while the replay computes the rest of the backward pass.
  std::unique_ptr<dist::OverlappedAverager> overlapped;
  std::function<void(const Tensor&)> grad_ready;
  const bool overlap =
      cfg.overlap == "true" || (cfg.overlap == "auto" && data_comm->spans_machines());
  if (graph_mode && overlap && data_comm->size() > 1 && device.host_accessible()) {
    overlapped = std::make_unique<dist::OverlappedAverager>(
        *data_comm, static_cast<std::size_t>(cfg.bucket_mb * 1e6));
    grad_ready = [&](const Tensor& grad) { overlapped->ready(grad); };
  }
  Progress progress(cfg.steps, cfg.progress && !cfg.json && lead, cfg.log_every, lead);
  Summary summary;
  std::vector<double> step_seconds;
  const std::int64_t end = cfg.stop_after > 0 ? std::min(cfg.stop_after, cfg.steps) : cfg.steps;
  for (std::int64_t step = start; step < end; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double lr = optim::cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps);
    nn::ForwardOptions options{true,
                               nn::mix_seed(static_cast<std::uint64_t>(cfg.seed) ^ 0xd20f, step)};
    double loss_value = 0.0;  // the whole batch's loss
    if (pipelined) {
      loss_value =
          pipeline->forward_backward(shard(source.batch(step, device), *data_comm), options);
      averager.average(model->parameters());  // this stage's, across replicas
      if (cfg.grad_clip > 0)
        pipeline->clip_grad_norm(cfg.grad_clip);
      loss_value = dist::mean_over_ranks(*data_comm, loss_value);
    } else {
      data::Batch batch = shard(source.batch(step, device), comm);
      Tensor loss = graph_mode ? graph_step.run(*model, batch, options, grad_ready)
                               : eager_step(*model, batch, options);
      if (overlapped && graph_step.replayed())
        overlapped->finish();
      else
        averager.average(model->parameters());
      // Step 2 replays and checks the replay against the same step run eagerly; from
      // step 3 on the replay runs alone (with the all-reduce overlapped, if on).
      if (graph_mode && lead && !cfg.json && step == start + 1)
        progress.message(graph_step.summary() + ", replay checked against eager execution");
      if (overlapped && lead && !cfg.json && step == start + 2)
        progress.message("graph: gradients all-reduced in " +
                         std::to_string(overlapped->buckets_last_step()) +
                         " buckets during the backward pass");
      if (cfg.grad_clip > 0)
        optim::clip_grad_norm(model->parameters(), cfg.grad_clip);
      loss_value = dist::mean_over_ranks(comm, loss.item());
    }
    optimizer.step(lr);
    optimizer.zero_grad();
    if (sharding)
      sharding->share_updates(model->parameters());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_seconds.push_back(seconds);
    check(std::isfinite(loss_value), "training diverged: loss = " + std::to_string(loss_value) +
                                         " at step " + std::to_string(step + 1) + "; lower --lr");
    if (step == start)
      summary.loss_first = loss_value;
    summary.loss_last = loss_value;
    progress.update(step, loss_value, static_cast<double>(source.items_per_step()) / seconds,
                    seconds, unit);
    metrics << nlohmann::json{{"step", step + 1},
                              {"loss", loss_value},
                              {"lr", lr},
                              {"ms", seconds * 1e3}}
                   .dump()
            << "\n";
    const bool evaluate = cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && source.text();
    const bool checkpoint =
        cfg.save && cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0 && step + 1 < end;
    if (pipelined && (evaluate || checkpoint))
      pipeline->gather_to_all(&optimizer);  // rank 0 needs every stage's weights
    if (lead && evaluate && !val_batches.empty()) {
      double val = mean_loss(*model, val_batches);
      progress.message("step " + std::to_string(step + 1) + ": val loss " + std::to_string(val) +
                       " (estimate over " + std::to_string(cfg.eval_batches) + " batches)");
      metrics << nlohmann::json{{"step", step + 1}, {"val_loss_estimate", val}}.dump() << "\n";
    }
    if (checkpoint && sharding)
      sharding->gather_moments(optimizer.first_moments(), optimizer.second_moments(),
                               model->parameters());
    if (lead && checkpoint)
      save_checkpoint(ckpt_dir, *model, spec, vocab_utf8, optimizer, step + 1, config_json);
    if (checkpoint && sharding)
      optimizer.keep_only(sharding->owned_here());
    metrics.flush();
  }
  progress.finish();
  summary.lead = lead;
  if (const graph::Graph* g = graph_step.graph(); g != nullptr && graph_step.replayed()) {
    summary.graph_nodes = static_cast<std::int64_t>(g->stats().nodes);
    summary.graph_memory_bytes = static_cast<std::int64_t>(g->stats().memory_bytes);
  }
  if (overlapped && graph_step.replayed())
    summary.overlapped_buckets = static_cast<std::int64_t>(overlapped->buckets_last_step());
  if (pipelined)
    pipeline->gather_to_all(&optimizer);
  if (sharding && cfg.save)
    sharding->gather_moments(optimizer.first_moments(), optimizer.second_moments(),
                             model->parameters());
  if (lead && cfg.save)
    save_checkpoint(ckpt_dir, *model, spec, vocab_utf8, optimizer, end, config_json);

  summary.steps = end - start;
  // The first step pays one-time costs (allocations, oneDNN kernel selection).
  std::vector<double> timed(step_seconds.begin() + (step_seconds.size() > 1 ? 1 : 0),
                            step_seconds.end());
  summary.step_ms_median = median(timed) * 1e3;
  summary.tokens_per_s = summary.step_ms_median > 0 ? static_cast<double>(source.items_per_step()) /
                                                          (summary.step_ms_median / 1e3)
                                                    : 0;
  if (lead && source.text() && cfg.final_eval) {
    summary.val_loss =
        cfg.model == "onnx"
            // An exported graph may have its batch size baked into reshapes: evaluate in
            // full batches of the training batch (the last val_windows % batch windows are
            // left out).
            ? mean_loss(*model, data::eval_windows(source.dataset().val(), cfg.context, cfg.batch,
                                                   device, true))
            : mean_loss(*model,
                        data::eval_windows(source.dataset().val(), cfg.context, 64, device));
    metrics << nlohmann::json{{"step", cfg.steps}, {"val_loss", *summary.val_loss}}.dump() << "\n";
  }
  if (lead && !source.text()) {
    summary.test_accuracy = test_accuracy(*model, source.test_set(), device);
    metrics << nlohmann::json{{"step", cfg.steps}, {"test_accuracy", *summary.test_accuracy}}.dump()
            << "\n";
  }
  // A data-parallel job's footprint is all of its processes: the sum of their peaks
  // (in KiB: a float sum is exact below 16 GiB, within 1e-7 relative above).
  float kib = static_cast<float>(peak_rss_bytes() / 1024);
  comm.all_reduce_sum(std::span<float>(&kib, 1));
  summary.peak_rss_bytes = static_cast<std::int64_t>(kib) * 1024;
  return summary;
}

std::string sample_text(const std::string& checkpoint, const std::string& prompt,
                        std::int64_t tokens, double temperature, std::uint64_t seed) {
  Backend& device = cpu::backend();
  LoadedModel loaded = load_model_file(checkpoint, device);
  check(loaded.spec.kind == "gpt",
        checkpoint + ": a " + loaded.spec.kind + " model does not generate text");
  check(loaded.tokenizer.size() > 0,
        checkpoint + ": has no character vocabulary (trained on random tokens?)");
  std::vector<std::int32_t> ids;
  if (prompt.empty()) {
    std::int32_t newline = loaded.tokenizer.encode_char(U'\n');
    ids.push_back(newline >= 0 ? newline : 0);
  } else {
    ids = loaded.tokenizer.encode(data::decode_utf8(prompt, "--prompt"), "--prompt");
  }
  std::size_t prompt_len = prompt.empty() ? 0 : ids.size();
  nn::Rng rng(seed);
  const std::int64_t v = loaded.spec.vocab;
  for (std::int64_t n = 0; n < tokens; ++n) {
    std::int64_t t =
        std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), loaded.spec.context);
    std::vector<std::int32_t> window(ids.end() - t, ids.end());
    ag::Tape tape;
    tape.set_recording(false);
    Tensor input = Tensor::from_ints({1, t}, window, device);
    std::vector<float> logits = loaded.model->forward(tape, input, {}).value().to_floats();
    const float* last = logits.data() + (t - 1) * v;
    std::int32_t next = 0;
    if (temperature <= 0.0) {
      next = static_cast<std::int32_t>(std::max_element(last, last + v) - last);
    } else {
      float m = *std::max_element(last, last + v);
      std::vector<double> p(v);
      double total = 0.0;
      for (std::int64_t j = 0; j < v; ++j)
        total += p[j] = std::exp((last[j] - m) / temperature);
      double r = rng.uniform() * total;
      next = static_cast<std::int32_t>(v - 1);
      for (std::int64_t j = 0; j < v; ++j) {
        if ((r -= p[j]) <= 0) {
          next = static_cast<std::int32_t>(j);
          break;
        }
      }
    }
    ids.push_back(next);
  }
  // Only the continuation: the caller prints the prompt itself.
  std::vector<std::int32_t> out(
      ids.begin() + static_cast<std::ptrdiff_t>(prompt.empty() ? 1 : prompt_len), ids.end());
  return loaded.tokenizer.decode(out);
}

double evaluate_text(const std::string& checkpoint, const std::string& data_path,
                     std::int64_t batch) {
  Backend& device = cpu::backend();
  LoadedModel loaded = load_model_file(checkpoint, device);
  check(loaded.spec.kind == "gpt",
        checkpoint + ": eval needs a gpt checkpoint, this one is " + loaded.spec.kind);
  check(loaded.tokenizer.size() > 0,
        checkpoint + ": has no character vocabulary to encode " + data_path);
  std::ifstream file(data_path, std::ios::binary);
  check(file.good(), data_path + ": cannot open the data file (missing or unreadable)");
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::int32_t> ids =
      loaded.tokenizer.encode(data::decode_utf8(bytes, data_path), data_path);
  check(static_cast<std::int64_t>(ids.size()) > loaded.spec.context,
        data_path + ": " + std::to_string(ids.size()) + " tokens; need more than the context of " +
            std::to_string(loaded.spec.context));
  return mean_loss(*loaded.model, data::eval_windows(ids, loaded.spec.context, batch, device));
}

}  // namespace loom::train
