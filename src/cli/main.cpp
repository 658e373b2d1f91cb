// cli/ — the one binary: the engine's commands (`loom train | sample | eval | export | data |
// ops | bench | onnx`) and the fleet's (`loom plan | fleet`). Each command parses its flags, calls
// one library function and prints; main only routes and turns an exception into the job contract's
// exit status.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

#include "cli/engine/bench_command.h"
#include "cli/engine/data_command.h"
#include "cli/engine/onnx_command.h"
#include "cli/engine/ops_command.h"
#include "cli/engine/train_command.h"
#include "cli/fleet/fleet_command.h"
#include "cli/fleet/fleet_rounds_command.h"
#include "cli/fleet/fleet_service_command.h"
#include "cli/fleet/plan_command.h"
#include "core/error.h"
#include "core/job_contract.h"
#include "dist/mpi_communicator.h"

namespace {

// Ends a command on an exception: its message on stderr, after what stdout holds, and the
// job contract's exit status for it.
int failed(const char* kind, const std::exception& e, loom::contract::ExitCode status) {
  std::fflush(stdout);
  std::fprintf(stderr, "loom: %s: %s\n", kind, e.what());
  std::fflush(stderr);
  // One failing rank of an MPI job ends the job: its peers must not wait for it.
  loom::dist::abort_job_after_failure(loom::contract::code(status));
  return loom::contract::code(status);
}

// `loom fleet ...`: the service's commands, rounds, or the discrete-event simulation.
int run_fleet_command(const loom::cli::FleetServiceOptions& service,
                      const loom::cli::FleetRoundsOptions& rounds,
                      const loom::cli::FleetOptions& simulate) {
  int status = 0;
  if (loom::cli::run_fleet_service(service, status))
    return status;
  if (rounds.command->parsed())
    return loom::cli::run_fleet_rounds(rounds);
  return loom::cli::run_fleet(simulate);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::cli;
  CLI::App app{"Loom: train anywhere, plan anywhere"};
  app.require_subcommand(1);
  // Each command and what runs it once parsed.
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands;

  // The engine's commands.
  TrainOptions train;
  commands.emplace_back(add_train_command(app, train), [&] { return run_train(train); });
  SampleOptions sample;
  commands.emplace_back(add_sample_command(app, sample), [&] { return run_sample(sample); });
  EvalOptions eval;
  commands.emplace_back(add_eval_command(app, eval), [&] { return run_eval(eval); });
  ExportOptions export_options;
  commands.emplace_back(add_export_command(app, export_options),
                        [&] { return run_export(export_options); });
  DataOptions data_options;
  commands.emplace_back(add_data_command(app, data_options),
                        [&] { return run_data(data_options); });
  OpsOptions ops;
  commands.emplace_back(add_ops_command(app, ops), [&] { return run_ops(ops); });
  BenchOptions bench;
  commands.emplace_back(add_bench_command(app, bench), [&] { return run_bench(bench); });
  OnnxOptions onnx;
  commands.emplace_back(add_onnx_command(app, onnx), [&] { return run_onnx(onnx); });

  // The fleet's commands.
  PlanOptions plan;
  commands.emplace_back(add_plan_command(app, plan), [&] { return run_plan(plan); });
  FleetOptions simulate;
  CLI::App* fleet = add_fleet_command(app, simulate);
  FleetServiceOptions service;
  add_fleet_service_commands(*fleet, service);
  FleetRoundsOptions rounds;
  add_fleet_rounds_command(*fleet, rounds);
  commands.emplace_back(fleet, [&] { return run_fleet_command(service, rounds, simulate); });

  CLI11_PARSE(app, argc, argv);
  try {
    for (const auto& [command, run] : commands)
      if (command->parsed())
        return run();
  } catch (const loom::DeviceUnavailable& e) {
    return failed("error", e, loom::contract::ExitCode::device_unavailable);
  } catch (const loom::Error& e) {
    return failed("error", e, loom::contract::ExitCode::error);
  } catch (const std::exception& e) {
    return failed("internal error", e, loom::contract::ExitCode::internal);
  }
  return loom::contract::code(loom::contract::ExitCode::ok);
}
