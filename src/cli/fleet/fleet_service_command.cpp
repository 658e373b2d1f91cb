#include "cli/fleet/fleet_service_command.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cluster/service/attempts.h"
#include "cluster/service/client.h"
#include "cluster/service/http_api.h"
#include "cluster/service/job_file.h"
#include "cluster/service/service.h"
#include "core/error.h"

namespace loom::cli {

namespace fs = std::filesystem;

void add_fleet_service_commands(CLI::App& fleet, FleetServiceOptions& o) {
  o.serve = fleet.add_subcommand("serve",
                                 "run the fleet service: a daemon that places and runs "
                                 "submitted training jobs on chip pools");
  o.serve->add_option("--state", o.state, "folder for the job store and the jobs' files")
      ->required();
  o.serve->add_option("--pools", o.pools, "pools.yaml: the pools and their executors")->required();
  o.serve->add_option("--listen", o.listen, "address to listen on (default 127.0.0.1)");
  o.serve->add_option("--port", o.port, "port (0: any free one, written to STATE/address)")
      ->check(CLI::Range(0, 65535));
  o.serve->add_option("--token", o.token,
                      "bearer token every request must carry (required off loopback; default "
                      "LOOM_FLEET_TOKEN)");
  o.serve->add_option("--policy", o.policy, "loom | cheapest | fastest | backfill | sjf | fifo")
      ->check(CLI::IsMember({"loom", "cheapest", "fastest", "backfill", "sjf", "fifo"}));
  o.serve->add_option("--catalog", o.catalog,
                      "chip catalog folder that pools' `chip` names (default: the repository's "
                      "catalog/)");
  o.serve->add_option("--crash-at", o.crash_at, "test hook: die at a crash point (docs/fleet.md)")
      ->group("");

  auto client = [&](CLI::App* cmd) {
    cmd->add_option("--server", o.server,
                    "the service, http://HOST:PORT (default "
                    "LOOM_FLEET_SERVER, else http://127.0.0.1:8470)");
    cmd->add_option("--token", o.token, "bearer token (default LOOM_FLEET_TOKEN)");
    cmd->add_flag("--json", o.json, "JSON output");
    return cmd;
  };
  o.submit = client(fleet.add_subcommand("submit", "submit a job (YAML) to the fleet service"));
  o.submit->add_option("job", o.job_file, "the job file")->required();
  o.status = client(fleet.add_subcommand("status", "jobs, or one job with its attempts"));
  o.status->add_option("id", o.job, "a job id");
  o.cancel = client(fleet.add_subcommand("cancel", "cancel a job"));
  o.cancel->add_option("id", o.job, "the job id")->required();
  o.logs = client(fleet.add_subcommand("logs", "a job's output"));
  o.logs->add_option("id", o.job, "the job id")->required();
  o.logs->add_option("--attempt", o.attempt, "the attempt (default: the latest)");
  o.logs->add_flag("-f,--follow", o.follow, "keep printing as the job writes, until it ends");
  o.pools_cmd = client(fleet.add_subcommand("pools", "the pools, their use and state"));
  o.drain = client(fleet.add_subcommand("drain", "stop placing jobs on a pool (running ones end)"));
  o.drain->add_option("pool", o.pool, "the pool")->required();
  o.drain->add_flag("--undo", o.undo, "open the pool again");
  o.events = client(fleet.add_subcommand("events", "the service's events"));
  o.events->add_option("--after", o.after, "events after this id");
  o.events->add_flag("-f,--follow", o.follow, "keep waiting for new events");
  o.supervise = fleet.add_subcommand("supervise", "(internal) run one attempt of a job");
  o.supervise->group("");
  o.supervise->add_option("--dir", o.dir)->required();
  o.supervise->add_option("--attempt", o.attempt)->required();
  o.supervise->add_option("command", o.command)->required();
}

namespace {

// ---------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------

std::atomic<int> stop_signal{0};
void on_stop(int signal) {
  stop_signal = signal;
}

int serve(const FleetServiceOptions& o) {
  service::ServiceOptions options;
  options.state_dir = o.state;
  options.pools_file = o.pools;
  options.policy = o.policy;
  options.catalog_dir = o.catalog;
  options.crash_at = o.crash_at;
  std::error_code ec;
  fs::create_directories(o.state, ec);
  check(!ec, o.state + ": cannot create the state folder: " + ec.message());
  // One daemon per state folder: a second one would launch every job twice.
  const std::string lock_path = o.state + "/serve.lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  check(lock >= 0 && ::flock(lock, LOCK_EX | LOCK_NB) == 0,
        o.state + ": another loom fleet serve uses this state folder (" + lock_path + " is held)");
  service::Service fleet(options);
  std::string token = o.token;
  if (token.empty())
    if (const char* env = std::getenv("LOOM_FLEET_TOKEN"))
      token = env;
  service::HttpApi api(fleet, {o.listen, o.port, token});
  api.bind();
  const std::string address = "http://" + o.listen + ":" + std::to_string(api.port());
  service::write_atomically(o.state + "/address", address + "\n");
  struct sigaction action {};
  action.sa_handler = on_stop;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  fleet.start();
  std::thread http([&] { api.serve(); });
  std::printf("loom fleet serve: %zu pools, policy %s, listening on %s\n", fleet.pools().size(),
              o.policy.c_str(), address.c_str());
  std::fflush(stdout);
  while (stop_signal == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Jobs keep running: they are their own sessions, and a restarted daemon adopts them.
  std::printf("loom fleet serve: stopping (jobs keep running; a restart adopts them)\n");
  api.stop();
  http.join();
  fleet.stop();
  ::close(lock);
  return 0;
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

std::string random_key() {
  std::random_device device;
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", device(), device(), device(), device());
  return text;
}

std::string when(double seconds) {
  if (seconds <= 0)
    return "-";
  const auto t = static_cast<std::time_t>(seconds);
  char text[32];
  std::strftime(text, sizeof text, "%H:%M:%S", std::localtime(&t));
  return text;
}

int submit(const FleetServiceOptions& o) {
  nlohmann::json job = service::read_job_file(o.job_file);
  if (job.is_object() && !job.contains("idempotency_key"))
    job["idempotency_key"] = random_key();  // a retry below cannot make a second job
  service::Client client(o.server, o.token);
  for (int attempt = 1;; ++attempt) {
    try {
      int status = 0;
      nlohmann::json answer = client.post("/api/jobs", job, &status);
      if (o.json)
        std::printf("%s\n", answer.dump().c_str());
      else
        std::printf("job %lld %s\n", static_cast<long long>(answer["id"].get<std::int64_t>()),
                    answer["created"].get<bool>() ? "submitted" : "exists already (same key)");
      return 0;
    } catch (const Error& e) {
      const bool unreachable = std::string(e.what()).rfind(service::Client::kUnreachable, 0) == 0;
      if (!unreachable || attempt >= 3)
        throw;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

int status(const FleetServiceOptions& o) {
  service::Client client(o.server, o.token);
  if (o.job > 0) {
    nlohmann::json j = client.get("/api/jobs/" + std::to_string(o.job));
    if (o.json) {
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    std::printf("job %lld: %s\n  state     %s\n  pool      %s\n  priority  %lld\n  reason    %s\n",
                static_cast<long long>(j["id"].get<std::int64_t>()),
                j["name"].get<std::string>().c_str(), j["state"].get<std::string>().c_str(),
                j["pool"].get<std::string>().c_str(),
                static_cast<long long>(j["priority"].get<std::int64_t>()),
                j["reason"].get<std::string>().c_str());
    for (const auto& a : j["attempt_list"])
      std::printf("  attempt %lld on %s: %s%s, %s\n",
                  static_cast<long long>(a["number"].get<std::int64_t>()),
                  a["pool"].get<std::string>().c_str(), a["state"].get<std::string>().c_str(),
                  a.contains("exit_code")
                      ? (" (exit " + std::to_string(a["exit_code"].get<int>()) + ")").c_str()
                      : "",
                  a["reason"].get<std::string>().c_str());
    if (!j["curve"].empty())
      std::printf(
          "  loss      %.4f at step %lld (%zu steps logged)\n", j["curve"].back()[1].get<double>(),
          static_cast<long long>(j["curve"].back()[0].get<std::int64_t>()), j["curve"].size());
    return 0;
  }
  nlohmann::json list = client.get("/api/jobs");
  if (o.json) {
    std::printf("%s\n", list.dump().c_str());
    return 0;
  }
  std::printf("%-5s %-20s %-12s %-10s %-4s %-8s %s\n", "id", "name", "state", "pool", "pri",
              "updated", "reason");
  for (const auto& j : list["jobs"])
    std::printf("%-5lld %-20.20s %-12s %-10s %-4lld %-8s %s\n",
                static_cast<long long>(j["id"].get<std::int64_t>()),
                j["name"].get<std::string>().c_str(), j["state"].get<std::string>().c_str(),
                j["pool"].get<std::string>().empty() ? "-" : j["pool"].get<std::string>().c_str(),
                static_cast<long long>(j["priority"].get<std::int64_t>()),
                when(j["updated_s"].get<double>()).c_str(), j["reason"].get<std::string>().c_str());
  return 0;
}

int logs(const FleetServiceOptions& o) {
  service::Client client(o.server, o.token);
  std::int64_t attempt = o.attempt, offset = 0;
  for (;;) {
    std::string path =
        "/api/jobs/" + std::to_string(o.job) + "/log?offset=" + std::to_string(offset);
    if (attempt > 0)
      path += "&attempt=" + std::to_string(attempt);
    nlohmann::json chunk;
    try {
      chunk = client.get(path);
    } catch (const Error& e) {
      // A job that has not started yet has no attempt to read.
      if (!o.follow || std::string(e.what()).find("is not in [1, 0]") == std::string::npos)
        throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    const std::string text = chunk["text"].get<std::string>();
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    offset = chunk["offset"].get<std::int64_t>();
    attempt = chunk["attempt"].get<std::int64_t>();
    if (!text.empty())
      continue;
    if (!o.follow)
      return 0;
    if (!chunk["last_attempt"].get<bool>()) {  // a newer attempt began: follow it
      ++attempt;
      offset = 0;
      std::printf("--- attempt %lld ---\n", static_cast<long long>(attempt));
      continue;
    }
    if (chunk["finished"].get<bool>())
      return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

int pools(const FleetServiceOptions& o) {
  service::Client client(o.server, o.token);
  nlohmann::json answer = client.get("/api/pools");
  if (o.json) {
    std::printf("%s\n", answer.dump().c_str());
    return 0;
  }
  std::printf("%-12s %-8s %-8s %-6s %-8s %-8s %s\n", "pool", "backend", "executor", "used",
              "price/h", "chip", "state");
  for (const auto& p : answer["pools"])
    std::printf(
        "%-12s %-8s %-8s %lld/%-4lld %-8.2f %-8s %s\n", p["name"].get<std::string>().c_str(),
        p["backend"].get<std::string>().c_str(), p["executor"].get<std::string>().c_str(),
        static_cast<long long>(p["used"].get<std::int64_t>()),
        static_cast<long long>(p["slots"].get<std::int64_t>()), p["price_per_hour"].get<double>(),
        p["chip"].get<std::string>().empty() ? "-" : p["chip"].get<std::string>().c_str(),
        p["draining"].get<bool>() ? "draining" : "open");
  return 0;
}

int events(const FleetServiceOptions& o) {
  service::Client client(o.server, o.token);
  std::int64_t after = o.after;
  do {
    nlohmann::json answer =
        client.get("/api/events?after=" + std::to_string(after) + (o.follow ? "&wait=30" : ""));
    for (const auto& e : answer["events"]) {
      after = e["id"].get<std::int64_t>();
      if (o.json)
        std::printf("%s\n", e.dump().c_str());
      else
        std::printf("%lld %s job %lld %-11s %s\n", static_cast<long long>(after),
                    when(e["time_s"].get<double>()).c_str(),
                    static_cast<long long>(e["job"].get<std::int64_t>()),
                    e["kind"].get<std::string>().c_str(), e["message"].get<std::string>().c_str());
    }
    std::fflush(stdout);
  } while (o.follow);
  return 0;
}

}  // namespace

bool run_fleet_service(const FleetServiceOptions& o, int& status_code) {
  if (o.supervise->parsed()) {
    status_code = service::supervise(service::AttemptFiles{o.dir, o.attempt}, o.command);
  } else if (o.serve->parsed()) {
    status_code = serve(o);
  } else if (o.submit->parsed()) {
    status_code = submit(o);
  } else if (o.status->parsed()) {
    status_code = status(o);
  } else if (o.cancel->parsed()) {
    service::Client(o.server, o.token)
        .post("/api/jobs/" + std::to_string(o.job) + "/cancel", nlohmann::json::object());
    std::printf("job %lld: cancel requested\n", static_cast<long long>(o.job));
    status_code = 0;
  } else if (o.logs->parsed()) {
    status_code = logs(o);
  } else if (o.pools_cmd->parsed()) {
    status_code = pools(o);
  } else if (o.drain->parsed()) {
    service::Client(o.server, o.token)
        .post("/api/pools/" + o.pool + (o.undo ? "/undrain" : "/drain"), nlohmann::json::object());
    std::printf("pool %s: %s\n", o.pool.c_str(), o.undo ? "open" : "draining");
    status_code = 0;
  } else if (o.events->parsed()) {
    status_code = events(o);
  } else {
    return false;
  }
  return true;
}

}  // namespace loom::cli
