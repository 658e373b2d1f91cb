#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/functions.h"
#include "core/error.h"
#include "data/indexed.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "dispatch/devices.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "nn/decoder.h"
#include "nn/init.h"
#include "onnx/model.h"
#include "train/checkpoint.h"
#include "train/training_run.h"

namespace loom::train {

namespace ag = loom::autograd;

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
  if (graph_fused_chains)
    j["graph_fused_chains"] = *graph_fused_chains;
  if (graph_memory_bytes)
    j["graph_memory_bytes"] = *graph_memory_bytes;
  if (overlapped_buckets)
    j["overlapped_buckets"] = *overlapped_buckets;
  if (prefetched_batches)
    j["prefetched_batches"] = *prefetched_batches;
  if (!collectives_per_step.empty()) {
    nlohmann::ordered_json c;
    for (const Collective& k : collectives_per_step)
      c[k.kind] = {{"calls", k.calls},
                   {"megabytes", k.megabytes},
                   {"ms", k.ms},
                   {"overlapped_ms", k.overlapped_ms}};
    j["collectives_per_step"] = c;
  }
  if (!peak_rss_bytes_per_rank.empty())
    j["peak_rss_bytes_per_rank"] = peak_rss_bytes_per_rank;
  if (!checkpoint_saves.empty()) {
    nlohmann::ordered_json saves = nlohmann::ordered_json::array();
    for (const CheckpointSave& c : checkpoint_saves)
      saves.push_back({{"step", c.step},
                       {"background", c.background},
                       {"stall_ms", c.stall_ms},
                       {"wait_ms", c.wait_ms},
                       {"write_ms", c.write_ms}});
    j["checkpoint_saves"] = saves;
  }
  if (checkpoint_load_ms)
    j["checkpoint_load_ms"] = *checkpoint_load_ms;
  if (layout)
    j["layout"] = {{"tp", layout->tp},
                   {"pp", layout->pp},
                   {"dp", layout->dp},
                   {"stage_blocks", layout->stage_blocks},
                   {"micro_batches", layout->micro_batches},
                   {"zero", layout->zero}};
  if (preempted)
    j["preempted"] = true;
  return j.dump();
}

// One short loop over the pieces of training_run.h, each with one job.
Summary run_training(const TrainConfig& cfg) {
  dist::mark_training_thread();       // collectives made elsewhere are overlapped with compute
  StopRule stop(cfg, dist::world());  // first: a stop signal during setup is a stop too
  TrainingRun run(cfg);               // processes, data, model, optimizer; resumed
  std::unique_ptr<StepMode> mode = make_step_mode(run);  // eager | graph | pipeline
  Report report(run);
  Evaluation evaluation(run);
  Checkpoints checkpoints(run);
  std::int64_t step = run.start;
  for (; !stop.reached(step); ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = optim::cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps);
    std::vector<dist::CollectiveTotals> before = dist::collective_totals();
    const double loss = mode->run(step);
    report.count_collectives(before, dist::collective_totals());
    if (step == run.start)
      run.write_test_gradients();  // LOOM_TEST_GRADIENTS only (a test hook, not counted)
    before = dist::collective_totals();
    run.update(lr);
    report.count_collectives(before, dist::collective_totals());
    report.step(step, loss, lr,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    report.message(mode->note(step));
    const bool evaluate = evaluation.due(step), checkpoint = checkpoints.due(step, stop.end());
    if (checkpoint)
      checkpoints.save(step + 1);
    if (evaluate) {  // rank 0 evaluates the whole model alone
      run.gather_full_state(false);
      evaluation.estimate(step, report);
      run.release_full_state();
    }
    report.flush();
  }
  if (stop.preempted())
    report.message("stop signal: checkpoint at step " + std::to_string(step) +
                   ", exiting as preempted (resume with --resume)");
  checkpoints.save_final(step);
  // Work still queued on the device finishes before the run returns: a driver's threads
  // must not be compiling or running kernels while the process exits (PoCL's crash).
  run.device.default_stream().synchronize();
  Summary summary = report.finish(step - run.start);
  summary.preempted = stop.preempted();
  mode->summarize(summary);
  checkpoints.summarize(summary);
  if (run.resumed)
    summary.checkpoint_load_ms = run.load_ms;
  run.describe_layout(summary);
  if (!summary.preempted)  // a preempted job must leave promptly
    evaluation.final(summary, report);
  report.measure_memory(summary);
  return summary;
}

namespace {

// The input shape a loaded text model takes for `rows` windows of `length` tokens: an
// imported graph may fix its batch and sequence length (symbolic dimensions are -1).
struct TextShape {
  std::int64_t batch = -1, length = -1;  // -1: free
};
TextShape text_shape(const LoadedModel& loaded) {
  TextShape shape;
  if (const auto* imported = dynamic_cast<const nn::OnnxModel*>(loaded.model.get())) {
    const auto& input = imported->graph().inputs.front();
    check(input.dtype != DType::f32, loaded.spec.onnx +
                                         ": the imported model takes float "
                                         "inputs (images), not token ids");
    if (input.shape.size() == 2) {
      shape.batch = input.shape[0];
      shape.length = input.shape[1];
    }
  }
  return shape;
}

}  // namespace

namespace {

// The next token from the last position's logits: greedy at temperature 0, else drawn from
// softmax(logits / temperature) restricted to the smallest set of most likely tokens whose
// probability reaches top_p.
std::int32_t pick_token(const float* logits, std::int64_t v, const SampleOptions& o, nn::Rng& rng) {
  if (o.temperature <= 0.0)
    return static_cast<std::int32_t>(std::max_element(logits, logits + v) - logits);
  const float m = *std::max_element(logits, logits + v);
  std::vector<double> p(static_cast<std::size_t>(v));
  double total = 0.0;
  for (std::int64_t j = 0; j < v; ++j)
    total += p[j] = std::exp((logits[j] - m) / o.temperature);
  std::vector<std::int32_t> order(static_cast<std::size_t>(v));
  for (std::int64_t j = 0; j < v; ++j)
    order[j] = static_cast<std::int32_t>(j);
  std::size_t kept = order.size();
  if (o.top_p < 1.0) {
    // Most likely first (ties by id, so the draw is reproducible), then the shortest prefix
    // whose mass reaches top_p.
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int32_t a, std::int32_t b) { return p[a] > p[b]; });
    double mass = 0.0;
    for (kept = 0; kept < order.size();) {
      mass += p[order[kept++]] / total;
      if (mass >= o.top_p)
        break;
    }
  }
  double kept_total = 0.0;
  for (std::size_t i = 0; i < kept; ++i)
    kept_total += p[order[i]];
  double r = rng.uniform() * kept_total;
  for (std::size_t i = 0; i < kept; ++i)
    if ((r -= p[order[i]]) <= 0)
      return order[i];
  return order[kept - 1];
}

// An imported graph with a fixed input shape: the window left-padded with its first token to
// the fixed length, in every row of a fixed batch; the prediction is the last position's.
std::vector<std::int32_t> generate_fixed_shape(LoadedModel& loaded, std::vector<std::int32_t> ids,
                                               const TextShape& fixed, const SampleOptions& o,
                                               Backend& device) {
  nn::Rng rng(o.seed);
  const std::size_t prompt_length = ids.size();
  const std::int64_t v = loaded.spec.vocab;
  const std::int64_t context = fixed.length > 0 ? fixed.length : loaded.spec.context;
  for (std::int64_t n = 0; n < o.tokens; ++n) {
    std::int64_t t = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), context);
    std::vector<std::int32_t> window(ids.end() - t, ids.end());
    std::int64_t length = t;
    if (fixed.length > 0 && t < fixed.length) {
      window.insert(window.begin(), static_cast<std::size_t>(fixed.length - t), window.front());
      length = fixed.length;
    }
    const std::int64_t rows = fixed.batch > 0 ? fixed.batch : 1;
    std::vector<std::int32_t> input;
    for (std::int64_t r = 0; r < rows; ++r)
      input.insert(input.end(), window.begin(), window.end());
    ag::Tape tape;
    tape.set_recording(false);
    std::vector<float> logits =
        loaded.model->forward(tape, Tensor::from_ints({rows, length}, input, device), {})
            .value()
            .to_floats();
    const std::int32_t next = pick_token(logits.data() + (length - 1) * v, v, o, rng);
    ids.push_back(next);
    if (next == o.eos)
      break;
  }
  return {ids.begin() + static_cast<std::ptrdiff_t>(prompt_length), ids.end()};
}

}  // namespace

std::vector<std::int32_t> generate(nn::Model& model, std::vector<std::int32_t> ids,
                                   std::int64_t context, const SampleOptions& o, Backend& device) {
  check(!ids.empty(), "generate: the prompt has no tokens");
  nn::Rng rng(o.seed);
  const std::size_t prompt_length = ids.size();
  auto* decoder = dynamic_cast<nn::Decoder*>(&model);
  nn::KvCache cache;
  std::size_t cached = 0;  // ids[0, cached) are in the cache
  for (std::int64_t n = 0; n < o.tokens; ++n) {
    std::vector<float> logits;
    std::int64_t v = 0;
    if (decoder != nullptr) {
      if (cache.length + static_cast<std::int64_t>(ids.size() - cached) > context) {
        // The cache holds at most `context` positions: start again from the last half.
        cache = nn::KvCache();
        cached =
            ids.size() -
            std::min(ids.size(), static_cast<std::size_t>(std::max<std::int64_t>(context / 2, 1)));
      }
      std::vector<std::int32_t> fresh(ids.begin() + static_cast<std::ptrdiff_t>(cached), ids.end());
      const std::int64_t t = static_cast<std::int64_t>(fresh.size());
      logits = decoder->decode(Tensor::from_ints({1, t}, fresh, device), cache).to_floats();
      cached = ids.size();
      v = static_cast<std::int64_t>(logits.size()) / t;
      logits.erase(logits.begin(), logits.end() - v);
    } else {
      const std::int64_t t = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), context);
      std::vector<std::int32_t> window(ids.end() - t, ids.end());
      ag::Tape tape;
      tape.set_recording(false);
      logits =
          model.forward(tape, Tensor::from_ints({1, t}, window, device), {}).value().to_floats();
      v = static_cast<std::int64_t>(logits.size()) / t;
      logits.erase(logits.begin(), logits.end() - v);
    }
    const std::int32_t next = pick_token(logits.data(), v, o, rng);
    ids.push_back(next);
    if (next == o.eos)
      break;
  }
  return {ids.begin() + static_cast<std::ptrdiff_t>(prompt_length), ids.end()};
}

std::string sample_text(const std::string& checkpoint, const std::string& prompt,
                        const SampleOptions& o) {
  Backend& device = dispatch::host();
  LoadedModel loaded = load_model_file(checkpoint, device);
  check(loaded.spec.kind == "gpt" || nn::is_decoder_family(loaded.spec.kind) ||
            loaded.spec.kind == "onnx",
        checkpoint + ": a " + loaded.spec.kind + " model does not generate text");
  SampleOptions options = o;
  if (loaded.subword) {  // a subword model: its tokenizer encodes, decodes and says when to stop
    const data::Tokenizer& tok = *loaded.subword;
    std::vector<std::int32_t> ids = tok.encode(prompt);
    if (ids.empty())
      ids.push_back(tok.eos().value_or(0));
    options.eos = tok.eos().value_or(-1);
    std::vector<std::int32_t> out =
        generate(*loaded.model, ids, loaded.spec.context, options, device);
    if (!out.empty() && out.back() == options.eos)
      out.pop_back();
    return tok.decode(out);
  }
  check(loaded.tokenizer.size() > 0,
        checkpoint + ": has no character vocabulary (trained on random tokens?)");
  const TextShape fixed = text_shape(loaded);
  std::vector<std::int32_t> ids;
  if (prompt.empty()) {
    std::int32_t newline = loaded.tokenizer.encode_char(U'\n');
    ids.push_back(newline >= 0 ? newline : 0);
  } else {
    ids = loaded.tokenizer.encode(data::decode_utf8(prompt, "--prompt"), "--prompt");
  }
  if (fixed.length > 0 || fixed.batch > 0)
    return loaded.tokenizer.decode(generate_fixed_shape(loaded, ids, fixed, options, device));
  return loaded.tokenizer.decode(
      generate(*loaded.model, ids, loaded.spec.context, options, device));
}

CheckpointScore evaluate_checkpoint(const std::string& checkpoint, const std::string& data_path,
                                    std::int64_t batch) {
  Backend& device = dispatch::host();
  LoadedModel loaded = load_model_file(checkpoint, device);
  CheckpointScore result;
  const bool images =
      loaded.spec.kind == "mlp" || loaded.spec.kind == "cnn" ||
      (loaded.spec.kind == "onnx" &&
       dynamic_cast<const nn::OnnxModel&>(*loaded.model).graph().inputs.front().dtype ==
           DType::f32);
  if (images) {
    // --data mnist (the bundled set) or a folder holding MNIST's IDX test files.
    const std::string dir = data_path == "mnist" ? "data/mnist" : data_path;
    data::ImageSet test =
        data::load_idx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
    data::normalize_mnist(test);
    result.test_accuracy = test_accuracy(*loaded.model, test, device);
    return result;
  }
  // The tokens and the bytes they stand for: a corpus's ids (its text decoded by the
  // checkpoint's tokenizer, where it has one), or a text file encoded by that tokenizer or
  // the character vocabulary.
  std::vector<std::int32_t> ids;
  std::optional<std::int64_t> bytes_count;
  if (data::is_indexed_corpus(data_path)) {
    ids = data::read_indexed(data_path).tokens;
    if (loaded.subword)
      bytes_count = static_cast<std::int64_t>(loaded.subword->decode(ids).size());
  } else {
    const std::string bytes = io::read_whole_file(data_path);
    bytes_count = static_cast<std::int64_t>(bytes.size());
    if (loaded.subword) {
      ids = loaded.subword->encode(bytes);
    } else {
      check(loaded.tokenizer.size() > 0,
            checkpoint + ": has no vocabulary (characters or a tokenizer) to encode " + data_path);
      ids = loaded.tokenizer.encode(data::decode_utf8(bytes, data_path), data_path);
    }
  }
  const TextShape fixed = text_shape(loaded);
  const std::int64_t context = fixed.length > 0 ? fixed.length : loaded.spec.context;
  check(static_cast<std::int64_t>(ids.size()) > context,
        data_path + ": " + std::to_string(ids.size()) + " tokens; need more than the context of " +
            std::to_string(context));
  // A fixed batch: windows in full batches of it (the last few windows are left out).
  const std::vector<data::Batch> windows = data::eval_windows(
      ids, context, fixed.batch > 0 ? fixed.batch : batch, device, fixed.batch > 0);
  result.loss = mean_loss(*loaded.model, windows);
  // Bits per byte, comparable across tokenizers: the mean loss per token (nats) times the
  // data's tokens per byte, in bits.
  if (bytes_count && *bytes_count > 0)
    result.bits_per_byte = *result.loss * static_cast<double>(ids.size()) /
                           (static_cast<double>(*bytes_count) * std::log(2.0));
  return result;
}

}  // namespace loom::train
