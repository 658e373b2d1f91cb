#include "cli/engine/train_command.h"

#include <cstdio>

#include "core/job_contract.h"
#include "train/config.h"
#include "train/hf_folder.h"
#include "train/layout.h"
#include "train/trainer.h"

namespace loom::cli {

namespace {

using train::TrainConfig;

// `--resume` alone means true (the contract's bare flags).
bool is_bool_flag(const std::string& key) {
  const contract::TrainKey* spec = contract::find_train_key(key);
  return spec != nullptr && spec->has(contract::kBareFlag);
}

std::string dashed(std::string key) {
  for (char& c : key)
    c = c == '_' ? '-' : c;
  return key;
}

void print_summary(const train::Summary& summary, const TrainConfig& cfg) {
  if (cfg.json) {
    std::printf("%s\n", summary.to_json().c_str());
    return;
  }
  std::printf("%s: %lld steps, loss %.4f -> %.4f", summary.preempted ? "preempted" : "done",
              static_cast<long long>(summary.steps), summary.loss_first, summary.loss_last);
  if (summary.val_loss)
    std::printf(", val loss %.4f", *summary.val_loss);
  if (summary.test_accuracy)
    std::printf(", test accuracy %.2f%%", 100.0 * *summary.test_accuracy);
  std::printf(", %.0f %s/s, %.1f ms/step, peak RSS %.0f MiB\n", summary.tokens_per_s,
              cfg.text() ? "tokens" : "images", summary.step_ms_median,
              static_cast<double>(summary.peak_rss_bytes) / (1 << 20));
  std::printf("checkpoint: %s/checkpoint\n", cfg.out.c_str());
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* train =
      app.add_subcommand("train", "train a model (defaults: char-level GPT on tiny Shakespeare)");
  o.command = train;
  train->add_option("config", o.config_path, "YAML config file (keys as the flags below)");
  for (const std::string& key : TrainConfig::keys()) {
    std::string names = "--" + key + (dashed(key) != key ? ",--" + dashed(key) : "");
    if (is_bool_flag(key))
      train->add_flag(names, o.flags[key], TrainConfig::help(key));
    else
      train->add_option(names, o.values[key], TrainConfig::help(key));
  }
  return train;
}

int run_train(const TrainOptions& o) {
  TrainConfig cfg;
  if (!o.config_path.empty())
    cfg.load_yaml(o.config_path);
  for (const std::string& key : TrainConfig::keys()) {
    if (o.command->count("--" + key) == 0)
      continue;
    cfg.set(key, is_bool_flag(key) ? (o.flags.at(key) ? "true" : "false") : o.values.at(key),
            "command line --" + key);
  }
  if (!cfg.layout.empty())  // `loom plan --json`'s layout: sets tp, pipeline, batch, ...
    train::apply_layout(cfg, dist::world());
  cfg.finalize();
  const train::Summary summary = train::run_training(cfg);
  if (summary.lead)  // rank 0 of a data-parallel job reports
    print_summary(summary, cfg);
  return contract::code(summary.preempted ? contract::ExitCode::preempted : contract::ExitCode::ok);
}

CLI::App* add_sample_command(CLI::App& app, SampleOptions& o) {
  CLI::App* sample = app.add_subcommand("sample",
                                        "generate text from a text model's checkpoint (GPT, the "
                                        "decoder families with a KV cache, ONNX)");
  sample->add_option("checkpoint", o.checkpoint, "checkpoint folder or model.safetensors")
      ->required();
  sample->add_option("--prompt", o.prompt, "text to continue");
  sample->add_option("--tokens", o.tokens, "characters to generate")->check(CLI::Range(0, 1 << 24));
  sample->add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sample
      ->add_option("--top_p", o.top_p,
                   "nucleus sampling: draw among the most likely tokens holding this much "
                   "probability (1: all)")
      ->check(CLI::Range(0.0, 1.0));
  sample->add_option("--seed", o.seed, "sampling seed");
  return sample;
}

int run_sample(const SampleOptions& o) {
  std::printf(
      "%s%s\n", o.prompt.c_str(),
      train::sample_text(o.checkpoint, o.prompt,
                         {o.tokens, o.temperature, o.top_p, static_cast<std::uint64_t>(o.seed), -1})
          .c_str());
  return contract::code(contract::ExitCode::ok);
}

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o) {
  CLI::App* eval = app.add_subcommand("eval",
                                      "a checkpoint's mean cross-entropy over a text file (text "
                                      "models) or its MNIST test accuracy (image models)");
  eval->add_option("checkpoint", o.checkpoint, "checkpoint folder or model.safetensors")
      ->required();
  eval->add_option("--data", o.data,
                   "a UTF-8 text file or an indexed corpus; image models: mnist or a folder of "
                   "MNIST IDX files")
      ->required();
  eval->add_option("--batch", o.batch, "windows per forward pass")->check(CLI::Range(1, 1 << 20));
  eval->add_flag("--json", o.json, "print a JSON object");
  return eval;
}

int run_eval(const EvalOptions& o) {
  const train::CheckpointScore score = train::evaluate_checkpoint(o.checkpoint, o.data, o.batch);
  if (score.loss && score.bits_per_byte && o.json)
    std::printf("{\"loss\": %.6f, \"bits_per_byte\": %.6f}\n", *score.loss, *score.bits_per_byte);
  else if (score.loss)
    std::printf(o.json ? "{\"loss\": %.6f}\n" : "%.6f\n", *score.loss);
  else
    std::printf(o.json ? "{\"test_accuracy\": %.6f}\n" : "test accuracy %.4f\n",
                *score.test_accuracy);
  return contract::code(contract::ExitCode::ok);
}

CLI::App* add_export_command(CLI::App& app, ExportOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "write a checkpoint as a Hugging Face model folder (config.json, model.safetensors)");
  cmd->add_option("--hf", o.checkpoint, "checkpoint folder or model.safetensors")->required();
  cmd->add_option("out", o.out, "the folder to write")->required();
  return cmd;
}

int run_export(const ExportOptions& o) {
  train::export_checkpoint_hf(o.checkpoint, o.out);
  std::printf("wrote %s (config.json, model.safetensors)\n", o.out.c_str());
  return contract::code(contract::ExitCode::ok);
}

}  // namespace loom::cli
