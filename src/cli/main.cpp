// cli/ — the one binary: `loom train | sample | eval | ops`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "cli/bench_command.h"
#include "cli/fleet_command.h"
#include "cli/fleet_rounds_command.h"
#include "cli/fleet_service_command.h"
#include "cli/onnx_command.h"
#include "cli/ops_command.h"
#include "cli/plan_command.h"
#include "core/error.h"
#include "core/job_contract.h"
#include "core/op_catalog.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

using loom::train::TrainConfig;

// `--resume` alone means true (the contract's bare flags).
bool is_bool_flag(const std::string& key) {
  const loom::contract::TrainKey* spec = loom::contract::find_train_key(key);
  return spec != nullptr && spec->has(loom::contract::kBareFlag);
}

// Ends a command on an exception: its message on stderr, after what stdout holds, and the
// job contract's exit status for it.
int failed(const char* kind, const std::exception& e, loom::contract::ExitCode status) {
  std::fflush(stdout);
  std::fprintf(stderr, "loom: %s: %s\n", kind, e.what());
  return loom::contract::code(status);
}

std::string dashed(std::string key) {
  for (char& c : key)
    c = c == '_' ? '-' : c;
  return key;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Loom: train anywhere, plan anywhere"};
  app.require_subcommand(1);

  // ---- train ----------------------------------------------------------------
  CLI::App* train =
      app.add_subcommand("train", "train a model (defaults: char-level GPT on tiny Shakespeare)");
  std::string config_path;
  train->add_option("config", config_path, "YAML config file (keys as the flags below)");
  std::map<std::string, std::string> values;
  std::map<std::string, bool> flags;
  for (const std::string& key : TrainConfig::keys()) {
    std::string names = "--" + key + (dashed(key) != key ? ",--" + dashed(key) : "");
    if (is_bool_flag(key)) {
      train->add_flag(names, flags[key], TrainConfig::help(key));
    } else {
      train->add_option(names, values[key], TrainConfig::help(key));
    }
  }

  // ---- sample ---------------------------------------------------------------
  CLI::App* sample =
      app.add_subcommand("sample", "generate text from a text model's checkpoint (GPT, ONNX)");
  std::string sample_ckpt, prompt;
  std::int64_t sample_tokens = 500, sample_seed = 1337;
  double temperature = 0.8;
  sample->add_option("checkpoint", sample_ckpt, "checkpoint folder or model.safetensors")
      ->required();
  sample->add_option("--prompt", prompt, "text to continue");
  sample->add_option("--tokens", sample_tokens, "characters to generate")
      ->check(CLI::Range(0, 1 << 24));
  sample->add_option("--temperature", temperature, "sampling temperature (0: greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sample->add_option("--seed", sample_seed, "sampling seed");

  // ---- eval -----------------------------------------------------------------
  CLI::App* eval = app.add_subcommand("eval",
                                      "a checkpoint's mean cross-entropy over a text file (text "
                                      "models) or its MNIST test accuracy (image models)");
  std::string eval_ckpt, eval_data;
  std::int64_t eval_batch = 64;
  eval->add_option("checkpoint", eval_ckpt, "checkpoint folder or model.safetensors")->required();
  eval->add_option("--data", eval_data,
                   "a UTF-8 text file; image models: mnist or a folder of MNIST IDX files")
      ->required();
  eval->add_option("--batch", eval_batch, "windows per forward pass")
      ->check(CLI::Range(1, 1 << 20));
  bool eval_json = false;
  eval->add_flag("--json", eval_json, "print a JSON object");

  // ---- ops ------------------------------------------------------------------
  loom::cli::OpsOptions ops_options;
  CLI::App* ops = loom::cli::add_ops_command(app, ops_options);

  // ---- bench ----------------------------------------------------------------
  loom::cli::BenchOptions bench_options;
  CLI::App* bench = loom::cli::add_bench_command(app, bench_options);

  // ---- onnx -----------------------------------------------------------------
  loom::cli::OnnxOptions onnx_options;
  CLI::App* onnx = loom::cli::add_onnx_command(app, onnx_options);

  // ---- plan -----------------------------------------------------------------
  loom::cli::PlanOptions plan_options;
  CLI::App* plan = loom::cli::add_plan_command(app, plan_options);

  // ---- fleet ----------------------------------------------------------------
  loom::cli::FleetOptions fleet_options;
  CLI::App* fleet = loom::cli::add_fleet_command(app, fleet_options);
  loom::cli::FleetServiceOptions fleet_service_options;
  loom::cli::add_fleet_service_commands(*fleet, fleet_service_options);
  loom::cli::FleetRoundsOptions fleet_rounds_options;
  loom::cli::add_fleet_rounds_command(*fleet, fleet_rounds_options);

  CLI11_PARSE(app, argc, argv);
  try {
    if (train->parsed()) {
      TrainConfig cfg;
      if (!config_path.empty())
        cfg.load_yaml(config_path);
      for (const std::string& key : TrainConfig::keys()) {
        std::string flag = "--" + key;
        if (train->count(flag) == 0)
          continue;
        cfg.set(key, is_bool_flag(key) ? (flags[key] ? "true" : "false") : values[key],
                "command line --" + key);
      }
      cfg.finalize();
      loom::train::Summary summary = loom::train::run_training(cfg);
      const int status = loom::contract::code(
          summary.preempted ? loom::contract::ExitCode::preempted : loom::contract::ExitCode::ok);
      if (!summary.lead)
        return status;  // rank 0 of a data-parallel job reports
      if (cfg.json) {
        std::printf("%s\n", summary.to_json().c_str());
      } else {
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
      return status;
    } else if (sample->parsed()) {
      std::printf("%s%s\n", prompt.c_str(),
                  loom::train::sample_text(sample_ckpt, prompt, sample_tokens, temperature,
                                           static_cast<std::uint64_t>(sample_seed))
                      .c_str());
    } else if (eval->parsed()) {
      const loom::train::CheckpointScore score =
          loom::train::evaluate_checkpoint(eval_ckpt, eval_data, eval_batch);
      if (score.loss)
        std::printf(eval_json ? "{\"loss\": %.6f}\n" : "%.6f\n", *score.loss);
      else
        std::printf(eval_json ? "{\"test_accuracy\": %.6f}\n" : "test accuracy %.4f\n",
                    *score.test_accuracy);
    } else if (ops->parsed()) {
      return loom::cli::run_ops(ops_options);
    } else if (bench->parsed()) {
      return loom::cli::run_bench(bench_options);
    } else if (onnx->parsed()) {
      return loom::cli::run_onnx(onnx_options);
    } else if (plan->parsed()) {
      return loom::cli::run_plan(plan_options);
    } else if (fleet->parsed()) {
      int status = 0;
      if (loom::cli::run_fleet_service(fleet_service_options, status))
        return status;
      if (fleet_rounds_options.command->parsed())
        return loom::cli::run_fleet_rounds(fleet_rounds_options);
      return loom::cli::run_fleet(fleet_options);
    }
  } catch (const loom::DeviceUnavailable& e) {
    return failed("error", e, loom::contract::ExitCode::device_unavailable);
  } catch (const loom::Error& e) {
    return failed("error", e, loom::contract::ExitCode::error);
  } catch (const std::exception& e) {
    return failed("internal error", e, loom::contract::ExitCode::internal);
  }
  return loom::contract::code(loom::contract::ExitCode::ok);
}
