#include "train/training_run.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <thread>

#include "autograd/functions.h"
#include "core/error.h"
#include "core/job_contract.h"
#include "data/tokenizer.h"
#include "dispatch/devices.h"
#include "dispatch/dispatch.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "nn/decoder.h"
#include "nn/hf_config.h"
#include "nn/init.h"
#include "onnx/model.h"
#include "train/hf_folder.h"

namespace loom::train {

namespace ag = loom::autograd;
namespace fs = std::filesystem;

namespace {

// Selects the device and its product precision. The host's kernels also run the partial
// backend and every fallback: they take the run's threads and start at f32 products.
Backend& open_device(const TrainConfig& cfg) {
  Backend& host = dispatch::host();
  host.set_threads(static_cast<int>(cfg.threads));
  host.set_matmul_precision(DType::f32);
  Backend& device = dispatch::device(cfg.device);
  check(device.set_matmul_precision(cfg.product_dtype()),
        "precision: '" + cfg.precision + "' is not supported on device '" + cfg.device + "'");
  return device;
}

// An imported model must take what the data gives, and graph mode must be able to replay it.
void check_imported_model(const nn::Model& model, const TrainConfig& cfg, const Source& source) {
  const auto* imported = dynamic_cast<const nn::OnnxModel*>(&model);
  if (imported == nullptr)
    return;
  const bool tokens = imported->graph().inputs.front().dtype != DType::f32;
  check(cfg.execution() != ExecutionMode::graph || imported->capturable(),
        cfg.onnx + ": mode = graph: " + imported->capture_refusal() + "; use mode = eager");
  check(tokens == source.text(), cfg.onnx + ": the model takes " +
                                     (tokens ? "token ids" : "float images") +
                                     (source.text() ? ", not text (data = " + cfg.data + ")"
                                                    : ", not MNIST images; give --data FILE"));
}

// A resumed run repeats the steps after its checkpoint: their lines (written before the
// interruption) are dropped, so metrics.jsonl holds each step once. Atomic rewrite.
// Returns the loss logged at `step` (the checkpoint's), when there is one.
std::optional<double> keep_metrics_through(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in.good())
    return std::nullopt;
  std::optional<double> loss_at_step;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  std::string kept;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty())
      continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    const bool valid = !record.is_discarded() && record.is_object() && record.contains("step") &&
                       record["step"].is_number_integer();
    if (!valid && i + 1 == lines.size())
      continue;  // the last line, torn by a kill during its write
    check(valid, path + ": line " + std::to_string(i + 1) +
                     " is not a metrics record with an integer 'step'; cannot resume its log");
    if (record["step"].get<std::int64_t>() <= step)
      kept += line + "\n";
    if (record["step"].get<std::int64_t>() == step && record.contains("loss") &&
        record["loss"].is_number())
      loss_at_step = record["loss"].get<double>();
  }
  io::write_file_atomically(path, kept);
  return loss_at_step;
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0.0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

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

double mean_loss(nn::Model& model, const std::vector<data::Batch>& batches) {
  double total = 0.0;
  std::int64_t count = 0;
  for (const auto& b : batches) {
    ag::Tape tape;
    tape.set_recording(false);
    ag::Var logits = model.forward(tape, b.inputs, {});
    double loss = ag::cross_entropy(tape, logits, b.targets).value().item();
    total += loss * static_cast<double>(b.targets.numel());
    count += b.targets.numel();
  }
  return count > 0 ? total / static_cast<double>(count) : 0.0;
}

// Qwen2's q/k/v biases, Qwen3's q/k norms; llama's biases only when `bias` is set.
ModelSpec decoder_spec(const TrainConfig& cfg, std::int64_t data_vocab) {
  ModelSpec spec;
  if (is_hf_folder(cfg.init)) {
    spec = hf_model_spec(cfg.init);
    check(cfg.context <= spec.context,
          "context = " + std::to_string(cfg.context) + " exceeds the model's " +
              "max_position_embeddings = " + std::to_string(spec.context) + " (" + cfg.init +
              "/config.json)");
  } else {
    nn::DecoderConfig c;
    c.family = cfg.model;
    c.vocab = data_vocab;
    c.hidden = cfg.width;
    c.heads = cfg.heads;
    c.kv_heads = cfg.kv_heads > 0 ? cfg.kv_heads : cfg.heads;
    c.head_dim = cfg.width / cfg.heads;
    // Llama's rule for the SwiGLU width: 2/3 of 4C (the same parameters as a 4C GELU MLP),
    // rounded up to a multiple of 32.
    c.intermediate = cfg.ffn > 0 ? cfg.ffn : (8 * cfg.width / 3 + 31) / 32 * 32;
    c.layers = cfg.layers;
    c.context = cfg.context;
    c.rope_theta = cfg.rope_theta;
    c.tie_embeddings = cfg.tie_embeddings;
    c.qkv_bias = cfg.model == "qwen2" ||
                 (cfg.model == "llama" && cfg.bias && cfg.explicitly_set.count("bias") > 0);
    c.o_bias = c.mlp_bias = cfg.model == "llama" && c.qkv_bias;
    c.qk_norm = cfg.model == "qwen3";
    c.validate();
    spec = decoder_model_spec(c);
  }
  check(data_vocab <= spec.vocab,
        "the data's vocabulary (" + std::to_string(data_vocab) +
            " tokens) exceeds the model's vocab_size = " + std::to_string(spec.vocab));
  spec.dropout = spec.kind == "gpt" ? cfg.dropout : 0.0;  // the Llama lineage has none
  return spec;
}

// ---------------------------------------------------------------------------
// TrainingRun
// ---------------------------------------------------------------------------

TrainingRun::TrainingRun(const TrainConfig& config)
    : cfg(config),
      device(open_device(config)),
      world(dist::world()),
      lead(world.rank() == 0),
      pipelined(config.pipeline > 1),
      source(config),
      data_comm_(&world),
      store_(config.out, static_cast<int>(config.keep_checkpoints)) {
  // An imported model's file is recorded by its absolute path, so that its checkpoints
  // load (sample, eval, resume) from any working directory.
  spec = ModelSpec{cfg.model,
                   source.vocab(),
                   cfg.context,
                   cfg.layers,
                   cfg.heads,
                   cfg.width,
                   cfg.dropout,
                   cfg.bias,
                   cfg.onnx.empty() ? "" : fs::absolute(cfg.onnx).lexically_normal().string(),
                   ""};
  if (nn::is_decoder_family(cfg.model) || is_hf_folder(cfg.init))
    spec = decoder_spec(cfg, source.vocab());
  check(!cfg.sequence_parallel || cfg.tp > 1,
        "sequence_parallel: shards the residual stream over tensor-parallel ranks; give --tp");
  if (pipelined || cfg.tp > 1) {
    // The job's processes as a grid: tensor-parallel ranks adjacent, pipeline stages
    // furthest apart, data-parallel replicas between (docs/parallel.md).
    const int tp = static_cast<int>(cfg.tp), pp = static_cast<int>(cfg.pipeline);
    std::string layout = tp > 1 ? "tp = " + std::to_string(tp) : "";
    if (pipelined)
      layout += (layout.empty() ? "" : " x ") + std::string("pipeline = ") + std::to_string(pp);
    check(world.size() % (tp * pp) == 0,
          layout + " needs a multiple of " + std::to_string(tp * pp) + " processes (mpirun -np " +
              std::to_string(tp * pp) + " x replicas), this job has " +
              std::to_string(world.size()));
    check(!pipelined || spec.kind == "gpt" || nn::is_decoder_family(spec.kind),
          "pipeline: the decoder models (gpt, llama, mistral, qwen2, qwen3) split into stages, "
          "not " +
              spec.kind);
    check(tp == 1 || nn::is_decoder_family(spec.kind),
          "tp = " + std::to_string(tp) +
              ": tensor parallelism splits llama, mistral, qwen2 and qwen3 models, not " +
              spec.kind);
    check(tp == 1 || cfg.execution() == ExecutionMode::eager,
          "tp with mode = graph: tensor-parallel steps run eagerly for now; use mode = eager");
    grid_ = std::make_unique<dist::ProcessGrid>(world,
                                                dist::GridShape{tp, world.size() / (tp * pp), pp});
    check(!cfg.sequence_parallel || !pipelined,
          "sequence_parallel with pipeline = " + std::to_string(pp) +
              ": the stages exchange whole activations for now; leave one of them out");
    if (tp > 1) {
      tensor_group_ = std::make_unique<dist::TensorGroupOf>(grid_->tp(), cfg.sequence_parallel);
      tensor_scope_ = std::make_unique<autograd::TensorGroupScope>(*tensor_group_);
    }
    data_comm_ = &grid_->dp();
  }
  check(cfg.batch % data_comm_->size() == 0,
        "batch = " + std::to_string(cfg.batch) + " does not divide among the " +
            std::to_string(data_comm_->size()) + " data-parallel " +
            (pipelined ? "replicas" : "processes"));
  model = make_model(spec, static_cast<std::uint64_t>(cfg.seed), device);
  check_imported_model(*model, cfg, source);
  if (is_hf_folder(cfg.init))
    load_hf_weights(cfg.init, *model);
  else if (!cfg.init.empty())
    load_weights(cfg.init, *model);
  optimizer = std::make_unique<optim::AdamW>(
      model->parameters(), optim::AdamWConfig{cfg.beta1, cfg.beta2, 1e-8, cfg.weight_decay});
  if (pipelined) {
    pipeline =
        std::make_unique<dist::Pipeline>(grid_->pp(), dynamic_cast<nn::Decoder&>(*model),
                                         cfg.micro_batches > 0 ? cfg.micro_batches : cfg.pipeline,
                                         cfg.schedule(), cfg.stage_counts());
    optimizer->keep_only(kept_moments());  // a stage keeps its own parameters' moments
  }
  const std::string folder = cfg.resume || cfg.auto_resume ? store_.newest() : "";
  resumed = !folder.empty();
  if (cfg.resume || resumed) {
    check(!folder.empty(), cfg.out + ": no checkpoint to resume from (expected " +
                               store_.link_path() + " or " + cfg.out + "/checkpoints/step-*)");
    const auto t0 = std::chrono::steady_clock::now();
    // The parameters are rank 0's, broadcast below: the others read only their moments.
    start = load_checkpoint(folder, *model, *optimizer, lead);
    load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    check(start <= cfg.steps, folder + ": checkpoint is at step " + std::to_string(start) +
                                  ", beyond steps = " + std::to_string(cfg.steps));
  }
  std::vector<nn::Parameter> params = model->parameters();
  dist::broadcast_parameters(world, params);
  if (cfg.tp > 1)
    shard_tensor_parallel();
  if (cfg.zero == 1 && data_comm_->size() > 1) {
    // Over the data-parallel group: with tp, each tensor-parallel rank's slices are sharded
    // among the replicas holding the same slices; with stages, each stage's own parameters.
    sharding = std::make_unique<dist::OptimizerSharding>(
        *data_comm_, model->parameters(),
        [this](std::size_t i) { return !pipeline || pipeline->uses(i); });
    optimizer->keep_only(kept_moments());
  }
  std::error_code ec;
  fs::create_directories(cfg.out, ec);
  check(!ec, cfg.out + ": cannot create the output folder: " + ec.message());
}

// Rows [rank B/N, (rank+1) B/N) of the inputs and the matching targets (a view; dispatch
// makes it contiguous where a kernel needs it).
data::Batch TrainingRun::local_batch(std::int64_t step) {
  return local_batch(step, device);
}

data::Batch TrainingRun::local_batch(std::int64_t step, Backend& backend) {
  data::Batch batch = source.batch(step, backend);
  const dist::Communicator& comm = data_comm();
  if (comm.size() == 1)
    return batch;
  std::int64_t rows = batch.inputs.dim(0) / comm.size(), first = comm.rank() * rows;
  std::int64_t per_row = batch.targets.numel() / batch.inputs.dim(0);
  return {batch.inputs.slice(0, first, first + rows),
          batch.targets.slice(0, first * per_row, (first + rows) * per_row)};
}

nn::ForwardOptions TrainingRun::forward_options(std::int64_t step) const {
  return nn::ForwardOptions{true,
                            nn::mix_seed(static_cast<std::uint64_t>(cfg.seed) ^ 0xd20f, step)};
}

void TrainingRun::update(double lr) {
  optimizer->step(lr);
  optimizer->zero_grad();
  if (sharding)
    sharding->all_gather_parameters(model->parameters());
}

namespace {
// The slice of `whole` this rank holds, tensor parallelism over `tp` ranks splitting it as `s`.
Tensor slice_here(const Tensor& whole, const nn::ShardedParameter& s, std::int64_t tp) {
  return dist::slice_of(whole, s.dim, s.slice, s.slices(static_cast<int>(tp)));
}
}  // namespace

void TrainingRun::shard_tensor_parallel() {
  sharded_ = dynamic_cast<nn::Decoder&>(*model).shard_tensor_parallel(grid_->at().tp,
                                                                      static_cast<int>(cfg.tp));
  // A resumed run's moments were loaded whole: keep this rank's slices of them too.
  for (const nn::ShardedParameter& s : sharded_)
    for (std::vector<Tensor>* moments : {&optimizer->first_moments(), &optimizer->second_moments()})
      if (s.index < moments->size() && (*moments)[s.index].defined())
        (*moments)[s.index] = slice_here((*moments)[s.index], s, cfg.tp);
}

double TrainingRun::clip_grad_norm(double max_norm) {
  std::vector<nn::Parameter>& params = model->parameters();
  if (!grid_ && !sharding)
    return optim::clip_grad_norm(params, max_norm);
  // The global norm: each parameter counted once: at the stage that owns it, at the
  // data-parallel rank that holds its reduced gradient (ZeRO), and, sharded, with its squares
  // summed over its tensor-parallel group (a replicated one's taken once; a slice several
  // ranks hold, at the first of them).
  std::vector<bool> is_sharded(params.size(), false), held_first(params.size(), true);
  const int tp_rank = cfg.tp > 1 ? grid_->at().tp : 0;
  for (const nn::ShardedParameter& s : sharded_) {
    is_sharded[s.index] = true;
    held_first[s.index] = s.first_holder(tp_rank, static_cast<int>(cfg.tp));
  }
  auto counted = [&](std::size_t i) {
    return !pipeline || (pipeline->uses(i) && pipeline->owns(i));
  };
  // Each parameter's sum of squares; with ZeRO only its owner has the reduced gradient, so
  // the others add 0 (exactly) and every rank then sums them in the order one process does:
  // the norm is bitwise plain data parallelism's.
  std::vector<float> squares_of(params.size(), 0.0f);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (counted(i) && params[i].var.grad().defined())
      squares_of[i] = dispatch::call1(OpId::sum_squares, {params[i].var.grad()}).item();
  if (sharding)
    data_comm_->all_reduce_sum(squares_of);
  float parts[2] = {0.0f, 0.0f};  // sharded, replicated: in parameter order, as one process
  for (std::size_t i = 0; i < params.size(); ++i)  // a parameter without a gradient adds 0
    if (counted(i) && held_first[i])
      parts[is_sharded[i] ? 0 : 1] += squares_of[i];
  if (cfg.tp > 1)
    grid_->tp().all_reduce_sum(std::span<float>(parts, 1));
  float squares = parts[0] + parts[1];
  if (pipeline)
    grid_->pp().all_reduce_sum(std::span<float>(&squares, 1));
  const double norm = std::sqrt(static_cast<double>(squares));
  optim::scale_grads_to_norm(params, norm, max_norm,
                             [&](std::size_t i) { return !pipeline || pipeline->uses(i); });
  return norm;
}

void TrainingRun::gather_full_state(bool moments) {
  // ZeRO's shards of the moments first, in the parameters' own (tensor-parallel) shapes.
  if (sharding && moments)
    sharding->gather_moments(optimizer->first_moments(), optimizer->second_moments(),
                             model->parameters());
  if (cfg.tp > 1 &&
      !gathered_) {  // every rank gets the whole model, replicated (to save, evaluate)
    std::vector<nn::Parameter>& params = model->parameters();
    for (const nn::ShardedParameter& s : sharded_) {
      const std::size_t i = s.index;
      params[i].var.set_value(dist::whole_of(grid_->tp(), params[i].var.value(), s.dim, s.parts));
      params[i].var.set_placement({});
      if (moments)
        for (std::vector<Tensor>* m : {&optimizer->first_moments(), &optimizer->second_moments()})
          if (i < m->size() && (*m)[i].defined())
            (*m)[i] = dist::whole_of(grid_->tp(), (*m)[i], s.dim, s.parts);
    }
    gathered_ = true;
    gathered_moments_ = moments;
  }
  if (pipeline)
    pipeline->gather_to_all(moments ? optimizer.get() : nullptr);  // rank 0: every stage
}

void TrainingRun::release_full_state() {
  if (cfg.tp > 1 && gathered_) {
    std::vector<nn::Parameter>& params = model->parameters();
    for (const nn::ShardedParameter& s : sharded_) {
      const std::size_t i = s.index;
      params[i].var.set_value(slice_here(params[i].var.value(), s, cfg.tp));
      autograd::Placement placement;
      placement.shard = s.dim;
      placement.parts = s.parts;
      params[i].var.set_placement(placement);
      if (gathered_moments_)
        for (std::vector<Tensor>* m : {&optimizer->first_moments(), &optimizer->second_moments()})
          if (i < m->size() && (*m)[i].defined())
            (*m)[i] = slice_here((*m)[i], s, cfg.tp);
    }
    gathered_ = gathered_moments_ = false;
  }
  if (sharding || pipeline)
    optimizer->keep_only(kept_moments());
}

std::vector<bool> TrainingRun::kept_moments() const {
  if (sharding)  // a subset of this stage's (OptimizerSharding is given the stage's)
    return sharding->owned_here();
  std::vector<bool> kept(model->parameters().size(), true);
  for (std::size_t i = 0; i < kept.size(); ++i)
    kept[i] = !pipeline || pipeline->uses(i);
  return kept;
}

void TrainingRun::write_test_gradients() {
  const char* path = std::getenv("LOOM_TEST_GRADIENTS");
  if (path == nullptr || *path == '\0')
    return;
  std::vector<nn::Parameter>& params = model->parameters();
  std::vector<const nn::ShardedParameter*> shard_of(params.size(), nullptr);
  for (const nn::ShardedParameter& s : sharded_)
    shard_of[s.index] = &s;
  std::vector<std::pair<std::string, Tensor>> gradients;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& value = params[i].var.value();
    Tensor grad = params[i].var.grad();
    if (sharding && sharding->owner(i) >= 0)  // ZeRO: the replica holding the reduced gradient
      grad = dist::broadcast_tensor(*data_comm_, grad, value.shape(), value.backend(),
                                    sharding->owner(i));
    if (pipeline)  // the owning stage's gradient (a tied head's: both stages' sum, on each)
      grad = dist::broadcast_tensor(grid_->pp(), grad, value.shape(), value.backend(),
                                    pipeline->owner(i));
    check(grad.defined(), params[i].name + ": no gradient after the step (LOOM_TEST_GRADIENTS)");
    if (shard_of[i] != nullptr)
      grad = dist::whole_of(grid_->tp(), grad, shard_of[i]->dim, shard_of[i]->parts);
    gradients.emplace_back(params[i].name, grad);
  }
  if (lead)
    io::write_safetensors(path, gradients, {});
}

void TrainingRun::describe_layout(Summary& summary) const {
  if (world.size() == 1)
    return;
  Summary::Layout l;
  l.tp = cfg.tp;
  l.pp = cfg.pipeline;
  l.dp = data_comm_->size();
  l.zero = sharding ? 1 : 0;
  if (pipeline) {
    l.micro_batches = pipeline->micro_batches();
    l.stage_blocks = pipeline->stage_blocks();
  }
  summary.layout = l;
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

Report::Report(TrainingRun& run)
    : run_(run),
      progress_(run.cfg.steps, run.cfg.progress && !run.cfg.json && run.lead, run.cfg.log_every,
                run.lead) {
  const TrainConfig& cfg = run.cfg;
  if (run.lead) {
    if (run.resumed)
      resumed_loss_ = keep_metrics_through(cfg.out + "/metrics.jsonl", run.start);
    metrics_.open(cfg.out + "/metrics.jsonl", run.resumed ? std::ios::app : std::ios::trunc);
    check(metrics_.good(), cfg.out + "/metrics.jsonl: cannot open for writing");
  }
  if (!cfg.json && run.lead)
    std::printf(
        "loom: training %s (%lld parameters) on %s, %lld steps from step %lld, %lld threads\n",
        cfg.model.c_str(), static_cast<long long>(run.model->parameter_count()),
        run.source.text() ? run.source.dataset().source().c_str() : "mnist",
        static_cast<long long>(cfg.steps), static_cast<long long>(run.start),
        static_cast<long long>(cfg.threads));
}

void Report::step(std::int64_t step, double loss, double lr, double seconds) {
  check(std::isfinite(loss), "training diverged: loss = " + std::to_string(loss) + " at step " +
                                 std::to_string(step + 1) + "; lower --lr");
  if (step_seconds_.empty())
    loss_first_ = loss;
  loss_last_ = loss;
  step_seconds_.push_back(seconds);
  progress_.update(step, loss, static_cast<double>(run_.source.items_per_step()) / seconds, seconds,
                   run_.source.unit());
  namespace fields = contract::record;  // what the fleet service reads of each line
  record(nlohmann::json{{fields::kStep, step + 1},
                        {fields::kLoss, loss},
                        {fields::kLearningRate, lr},
                        {fields::kStepMs, seconds * 1e3}}
             .dump());
  // Out before any checkpoint of this step is published: a run killed right after it
  // resumes at the next step, so this step's line must already be in the file.
  flush();
}

void Report::message(const std::string& line) {
  if (run_.lead && !run_.cfg.json && !line.empty())
    progress_.message(line);
}

void Report::record(const std::string& json_line) {
  metrics_ << json_line << "\n";
}

void Report::flush() {
  metrics_.flush();
}

Summary Report::finish(std::int64_t steps) {
  progress_.finish();
  Summary summary;
  summary.lead = run_.lead;
  summary.steps = steps;
  summary.loss_first = loss_first_;
  summary.loss_last = loss_last_;
  if (step_seconds_.empty() && resumed_loss_) {
    // Resumed at its last step, the run had nothing left to do: its losses are the ones
    // logged at that step, not a made-up 0.
    summary.loss_first = summary.loss_last = *resumed_loss_;
  }
  // The first step pays one-time costs (allocations, oneDNN kernel selection).
  std::vector<double> timed(step_seconds_.begin() + (step_seconds_.size() > 1 ? 1 : 0),
                            step_seconds_.end());
  summary.step_ms_median = median(timed) * 1e3;
  const double steps_run = static_cast<double>(step_seconds_.size());
  for (std::size_t k = 0; k < collectives_.size() && run_.world.size() > 1 && steps_run > 0; ++k)
    if (collectives_[k].calls > 0)
      summary.collectives_per_step.push_back(
          {dist::collective_name(static_cast<dist::CollectiveKind>(k)),
           static_cast<double>(collectives_[k].calls) / steps_run,
           collectives_[k].bytes / 1e6 / steps_run, collectives_[k].seconds * 1e3 / steps_run,
           collectives_[k].overlapped_seconds * 1e3 / steps_run});
  summary.tokens_per_s =
      summary.step_ms_median > 0
          ? static_cast<double>(run_.source.items_per_step()) / (summary.step_ms_median / 1e3)
          : 0;
  return summary;
}

void Report::measure_memory(Summary& summary) {
  // A data-parallel job's footprint is all of its processes: the sum of their peaks
  // (in KiB: a float sum is exact below 16 GiB, within 1e-7 relative above).
  const float mine = static_cast<float>(peak_rss_bytes() / 1024);
  float kib = mine;
  run_.world.all_reduce_sum(std::span<float>(&kib, 1));
  summary.peak_rss_bytes = static_cast<std::int64_t>(kib) * 1024;
  if (run_.world.size() > 1) {
    std::vector<float> each(static_cast<std::size_t>(run_.world.size()));
    run_.world.all_gather(std::span<const float>(&mine, 1), each);
    for (float k : each)
      summary.peak_rss_bytes_per_rank.push_back(static_cast<std::int64_t>(k) * 1024);
  }
}

void Report::count_collectives(const std::vector<dist::CollectiveTotals>& before,
                               const std::vector<dist::CollectiveTotals>& after) {
  collectives_.resize(after.size());
  for (std::size_t k = 0; k < after.size(); ++k) {
    collectives_[k].calls += after[k].calls - before[k].calls;
    collectives_[k].overlapped_calls += after[k].overlapped_calls - before[k].overlapped_calls;
    collectives_[k].bytes += after[k].bytes - before[k].bytes;
    collectives_[k].seconds += after[k].seconds - before[k].seconds;
    collectives_[k].overlapped_seconds +=
        after[k].overlapped_seconds - before[k].overlapped_seconds;
  }
}

// ---------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------

Evaluation::Evaluation(TrainingRun& run) : run_(run) {
  const TrainConfig& cfg = run.cfg;
  if (!run.source.text() || cfg.eval_every <= 0 || !run.lead)
    return;
  for (std::int64_t i = 0; i < cfg.eval_batches; ++i)
    val_batches_.push_back(run.source.dataset().sample(
        run.source.dataset().val(), cfg.batch, cfg.context,
        nn::mix_seed(static_cast<std::uint64_t>(cfg.seed) ^ 0xe7a1, i), run.device));
}

bool Evaluation::due(std::int64_t step) const {
  return run_.cfg.eval_every > 0 && (step + 1) % run_.cfg.eval_every == 0 && run_.source.text();
}

void Evaluation::estimate(std::int64_t step, Report& report) {
  if (!run_.lead || val_batches_.empty())
    return;
  double val = mean_loss(*run_.model, val_batches_);
  report.message("step " + std::to_string(step + 1) + ": val loss " + std::to_string(val) +
                 " (estimate over " + std::to_string(run_.cfg.eval_batches) + " batches)");
  report.record(nlohmann::json{{"step", step + 1}, {"val_loss_estimate", val}}.dump());
}

void Evaluation::final(Summary& summary, Report& report) {
  const TrainConfig& cfg = run_.cfg;
  if (!run_.lead)
    return;
  const data::TextDataset& text = run_.source.dataset();
  if (run_.source.text() && cfg.final_eval) {
    // An exported graph may have its batch size baked into reshapes: evaluate it in full
    // batches of the training batch (the last val_windows % batch windows are left out).
    summary.val_loss =
        cfg.model == "onnx"
            ? mean_loss(*run_.model,
                        data::eval_windows(text.val(), cfg.context, cfg.batch, run_.device, true))
            : mean_loss(*run_.model, data::eval_windows(text.val(), cfg.context, 64, run_.device));
    report.record(nlohmann::json{{"step", cfg.steps}, {"val_loss", *summary.val_loss}}.dump());
  }
  if (!run_.source.text() && cfg.final_eval) {  // the image models' full pass: the test set
    summary.test_accuracy = test_accuracy(*run_.model, run_.source.test_set(), run_.device);
    report.record(
        nlohmann::json{{"step", cfg.steps}, {"test_accuracy", *summary.test_accuracy}}.dump());
  }
}

// ---------------------------------------------------------------------------
// The stop rule (Checkpoints: train/run_checkpoints.cpp)
// ---------------------------------------------------------------------------

namespace {
// The signal that asked the run to stop (0: none). Handlers may only touch such a flag.
volatile std::sig_atomic_t stop_signal = 0;
struct sigaction previous_term, previous_int;

void on_stop_signal(int signal) {
  if (stop_signal != 0 && signal == SIGINT) {  // asked twice: stop now
    ::sigaction(SIGINT, &previous_int, nullptr);
    std::raise(SIGINT);
    return;
  }
  stop_signal = signal;
}
}  // namespace

StopRule::StopRule(const TrainConfig& cfg, dist::Communicator& world)
    : end_(cfg.stop_after > 0 ? std::min(cfg.stop_after, cfg.steps) : cfg.steps), world_(world) {
  if (const char* hold = std::getenv("LOOM_TEST_HOLD_AT_STEP"); hold != nullptr && *hold) {
    char* end = nullptr;
    const long long value = std::strtoll(hold, &end, 10);
    check(*end == '\0' && value > 0, [&] {
      return std::string("LOOM_TEST_HOLD_AT_STEP='") + hold +
             "': expected a step number of at least 1 (the run waits for a stop signal there)";
    });
    hold_at_ = value;
  }
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, &previous_term);
  ::sigaction(SIGINT, &action, &previous_int);
}

StopRule::~StopRule() {
  ::sigaction(SIGTERM, &previous_term, nullptr);
  ::sigaction(SIGINT, &previous_int, nullptr);
}

bool StopRule::reached(std::int64_t step) {
  if (step >= end_)
    return true;
  if (first_step_ < 0)
    first_step_ = step;
  if (step == hold_at_ && step > first_step_)  // not again when resumed at the held step
    hold_for_stop_signal(step);
  float asked = stop_signal != 0 ? 1.0f : 0.0f;
  if (world_.size() > 1)
    world_.all_reduce_sum(std::span<float>(&asked, 1));
  preempted_ = asked > 0;
  return preempted_;
}

void StopRule::hold_for_stop_signal(std::int64_t step) {
  // Every process polls together (one all-reduce a round), so a signal to any one rank
  // releases them all at the same round, as reached() then stops them at the same step.
  constexpr auto kPoll = std::chrono::milliseconds(2);
  constexpr auto kLimit = std::chrono::seconds(300);
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  for (;;) {
    float asked = stop_signal != 0 ? 1.0f : 0.0f;
    if (world_.size() > 1)
      world_.all_reduce_sum(std::span<float>(&asked, 1));
    if (asked > 0)
      return;
    check(std::chrono::steady_clock::now() < deadline, [&] {
      return "LOOM_TEST_HOLD_AT_STEP=" + std::to_string(step) + ": no stop signal within " +
             std::to_string(kLimit.count()) + " s of holding after step " + std::to_string(step);
    });
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace loom::train
