// cli/fleet/fleet_service_command — the live fleet: `loom fleet serve` (the daemon) and its
// client commands (submit, status, cancel, logs, pools, drain, events), plus `loom fleet
// supervise`, the process the daemon launches around each training attempt.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

struct FleetServiceOptions {
  // serve
  std::string state, pools, listen = "127.0.0.1", policy = "loom", crash_at, catalog;
  int port = 8470;
  // client
  std::string server;  // http://HOST:PORT (default: LOOM_FLEET_SERVER, else 127.0.0.1:8470)
  std::string token;   // default: LOOM_FLEET_TOKEN
  std::string job_file;
  std::int64_t job = 0, attempt = 0, after = 0;
  std::string pool;
  bool json = false, follow = false, undo = false;
  // supervise
  std::string dir;
  std::vector<std::string> command;

  CLI::App *serve = nullptr, *submit = nullptr, *status = nullptr, *cancel = nullptr,
           *logs = nullptr, *pools_cmd = nullptr, *drain = nullptr, *events = nullptr,
           *supervise = nullptr;
};

void add_fleet_service_commands(CLI::App& fleet, FleetServiceOptions& options);
// True when one of these commands was given (then `status` is its exit status).
bool run_fleet_service(const FleetServiceOptions& options, int& status);

}  // namespace loom::cli
