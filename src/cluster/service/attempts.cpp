#include "cluster/service/attempts.h"

#include "cluster/service/executor.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace loom::service {

namespace fs = std::filesystem;

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void write_atomically(const std::string& path, const std::string& contents) {
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, temp + ": cannot create: " + std::strerror(errno));
  std::size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ::close(fd);
      throw Error(temp + ": write failed: " + std::strerror(errno));
    }
    written += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  check(synced, temp + ": fsync failed");
  check(::rename(temp.c_str(), path.c_str()) == 0,
        path + ": rename failed: " + std::strerror(errno));
  int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void append_synced(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  check(fd >= 0, path + ": cannot open for appending: " + std::strerror(errno));
  const std::string text = line + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  check(ok, path + ": append failed");
}

std::int64_t launch_attempt(const std::string& loom, const AttemptFiles& files,
                            const std::vector<std::string>& command) {
  // The lock first, held across fork(): from here until the attempt's last process exits
  // the attempt is visibly alive. No O_CLOEXEC: the supervisor and the training process
  // inherit it.
  int lock = ::open(files.lock().c_str(), O_RDWR | O_CREAT, 0644);
  check(lock >= 0, files.lock() + ": cannot create: " + std::strerror(errno));
  if (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock);
    throw Error(files.lock() + ": held by a live process; attempt " + std::to_string(files.number) +
                " is running already");
  }
  int log = ::open(files.log().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    ::close(lock);
    throw Error(files.log() + ": cannot create: " + std::strerror(errno));
  }
  // Everything the child needs is built before fork(): a multithreaded process may only
  // make async-signal-safe calls between fork() and exec().
  std::vector<std::string> args{
      loom, "fleet", "supervise", "--dir", files.dir, "--attempt", std::to_string(files.number),
      "--"};
  args.insert(args.end(), command.begin(), command.end());
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(lock);
    ::close(log);
    throw Error("fleet: fork failed: " + std::string(std::strerror(errno)));
  }
  if (pid == 0) {
    ::setsid();  // its own session and process group: it outlives the service
    int null_in = ::open("/dev/null", O_RDONLY);
    if (null_in >= 0)
      ::dup2(null_in, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    // Nothing else of the service's may leak into the attempt (its listening socket would
    // keep a restarted service from binding its port): only 0-2 and the lock stay open.
    if (lock > 3)
      ::close_range(3, static_cast<unsigned>(lock - 1), 0);
    ::close_range(static_cast<unsigned>(lock + 1), ~0U, 0);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log);
  ::close(lock);  // the child's copy keeps it held
  return pid;
}

AttemptStatus probe_attempt(const AttemptFiles& files) {
  AttemptStatus status;
  // The supervisor's pid, from its start record (also when the store lost it in a crash).
  if (std::ifstream records(files.records()); records.good()) {
    for (std::string line; std::getline(records, line);) {
      nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
      if (r.is_object() && r.value("attempt", -1) == files.number &&
          r.value("event", "") == "start")
        status.pid = r.value("pid", std::int64_t{0});
    }
  }
  int lock = ::open(files.lock().c_str(), O_RDWR | O_CLOEXEC);
  if (lock >= 0) {
    const bool held = ::flock(lock, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(lock);  // releases it if this probe took it
    if (held) {
      status.state = AttemptStatus::State::alive;
      return status;
    }
  }
  // No live process can hold the lock again (attempt numbers are never reused).
  if (std::ifstream exit_record(files.exit_record()); exit_record.good()) {
    nlohmann::json r = nlohmann::json::parse(exit_record, nullptr, false);
    if (r.is_object() && r.contains("exit") && r["exit"].is_number_integer()) {
      status.state = AttemptStatus::State::exited;
      status.exit_code = r["exit"].get<int>();
      return status;
    }
  }
  status.state = AttemptStatus::State::lost;
  return status;
}

void signal_attempt(std::int64_t pid, int signal) {
  if (pid > 1)
    ::kill(-static_cast<pid_t>(pid), signal);
}

void LocalExecutor::stop(const PoolSpec&, std::int64_t handle) {
  signal_attempt(handle, SIGTERM);
}

namespace {
void ignore_but_survive(int) {}  // a handler, not SIG_IGN: exec() resets it for the child
}  // namespace

int supervise(const AttemptFiles& files, const std::vector<std::string>& command) {
  check(!command.empty(), "fleet supervise: no command to run");
  append_synced(files.records(), nlohmann::json{{"attempt", files.number},
                                                {"event", "start"},
                                                {"pid", ::getpid()},
                                                {"time", wall_seconds()}}
                                     .dump());
  struct sigaction action {};
  action.sa_handler = ignore_but_survive;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  std::vector<std::string> args = command;
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t child = ::fork();
  check(child >= 0, "fleet supervise: fork failed");
  if (child == 0) {
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "fleet supervise: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  append_synced(files.records(), nlohmann::json{{"attempt", files.number},
                                                {"event", "end"},
                                                {"pid", ::getpid()},
                                                {"exit", code},
                                                {"time", wall_seconds()}}
                                     .dump());
  write_atomically(files.exit_record(),
                   nlohmann::json{{"exit", code}, {"time", wall_seconds()}}.dump());
  return 0;
}

}  // namespace loom::service
