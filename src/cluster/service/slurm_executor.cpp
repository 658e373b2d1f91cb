#include "cluster/service/slurm_executor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace loom::service {

namespace fs = std::filesystem;

int run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                std::string& out, std::string& err) {
  int out_pipe[2], err_pipe[2];
  check(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
        "fleet: pipe failed: " + std::string(std::strerror(errno)));
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e)
    environment.emplace_back(*e);
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> cenv;
  for (std::string& e : environment)
    cenv.push_back(e.data());
  cenv.push_back(nullptr);
  const pid_t pid = ::fork();
  check(pid >= 0, "fleet: fork failed: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close_range(3, ~0U, 0);
    ::execvpe(cargs[0], cargs.data(), cenv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  out.clear();
  err.clear();
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_pipes = 2;
  char buffer[4096];
  while (open_pipes > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP)))
        continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        (i == 0 ? out : err).append(buffer, static_cast<std::size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {

std::vector<std::string> slurm_env(const PoolSpec& pool) {
  return pool.slurm_conf.empty() ? std::vector<std::string>{}
                                 : std::vector<std::string>{"SLURM_CONF=" + pool.slurm_conf};
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

// The last line of a command's output (Slurm prints warnings before the answer).
std::string last_line(const std::string& text) {
  std::string t = trimmed(text);
  const auto newline = t.rfind('\n');
  return newline == std::string::npos ? t : t.substr(newline + 1);
}

bool all_digits(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

// A shell word: single quotes, with any single quote closed, escaped and reopened.
std::string shell_word(const std::string& word) {
  std::string q = "'";
  for (char c : word)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string SlurmExecutor::job_name(const AttemptFiles& files) {
  return "loom-" + fs::path(files.dir).filename().string() + "-" + std::to_string(files.number);
}

std::int64_t SlurmExecutor::launch(const PoolSpec& pool, const AttemptFiles& files,
                                   const std::vector<std::string>& command) {
  const std::string name = job_name(files);
  std::string out, err;
  // Submitted already (by this service before a crash)? Then that job is the attempt. A
  // submission Slurm refused (BadConstraints) keeps its id as FAILED: it does not count.
  if (run_command({"squeue", "-h", "-t", "all", "--name", name, "-o", "%i %T %r"}, slurm_env(pool),
                  out, err) == 0) {
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      std::string id, state, reason;
      fields >> id >> state >> reason;
      if (all_digits(id) && !(state == "FAILED" && reason == "BadConstraints"))
        return std::stoll(id);
    }
  }
  // The batch script execs the supervisor, so scancel's TERM reaches it and (with --full)
  // the training process it runs; the supervisor records the end on the shared folder.
  std::string script = "#!/bin/sh\nexec " + shell_word(loom_) + " fleet supervise --dir " +
                       shell_word(files.dir) + " --attempt " + std::to_string(files.number) + " --";
  for (const std::string& word : command)
    script += " " + shell_word(word);
  script += "\n";
  const std::string script_path =
      files.dir + "/attempt-" + std::to_string(files.number) + ".sbatch";
  write_atomically(script_path, script);
  fs::permissions(script_path, fs::perms::owner_all, fs::perm_options::add);
  std::vector<std::string> argv{
      "sbatch",   "--parsable", "--job-name", name,
      "--output", files.log(),  "--chdir",    fs::current_path().string()};
  if (!pool.partition.empty())
    argv.insert(argv.end(), {"--partition", pool.partition});
  if (!pool.gres.empty())
    argv.insert(argv.end(), {"--gres", pool.gres});
  argv.push_back(script_path);
  const int status = run_command(argv, slurm_env(pool), out, err);
  const std::string id = last_line(out);
  check(status == 0 && all_digits(id.substr(0, id.find(';'))),
        "sbatch for pool " + pool.name + " failed (status " + std::to_string(status) +
            "): " + trimmed(err.empty() ? out : err));
  return std::stoll(id.substr(0, id.find(';')));
}

AttemptStatus SlurmExecutor::probe(const PoolSpec& pool, const AttemptFiles& files,
                                   std::optional<std::int64_t> handle) {
  AttemptStatus status;
  std::string out, err;
  std::string state;
  std::vector<std::string> query{"squeue", "-h", "-t", "all", "-o", "%i %T"};
  if (handle)
    query.insert(query.end(), {"-j", std::to_string(*handle)});
  else
    query.insert(query.end(), {"--name", job_name(files)});
  if (run_command(query, slurm_env(pool), out, err) == 0) {
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      std::string id, s;
      fields >> id >> s;
      if (all_digits(id)) {
        state = s;
        status.pid = std::stoll(id);
      }
    }
  }
  static const std::vector<std::string> live{"PENDING",   "CONFIGURING", "RUNNING",  "COMPLETING",
                                             "SUSPENDED", "REQUEUED",    "RESIZING", "STOPPED"};
  for (const std::string& s : live)
    if (state == s) {
      status.state = AttemptStatus::State::alive;
      return status;
    }
  // Ended (or aged out of Slurm's memory): the supervisor's exit record tells the status.
  if (std::ifstream record(files.exit_record()); record.good()) {
    nlohmann::json r = nlohmann::json::parse(record, nullptr, false);
    if (r.is_object() && r.contains("exit") && r["exit"].is_number_integer()) {
      status.state = AttemptStatus::State::exited;
      status.exit_code = r["exit"].get<int>();
      return status;
    }
  }
  status.state = AttemptStatus::State::lost;  // cancelled before it ran, node failure...
  return status;
}

void SlurmExecutor::stop(const PoolSpec& pool, std::int64_t handle) {
  std::string out, err;
  run_command({"scancel", "--signal=TERM", "--full", std::to_string(handle)}, slurm_env(pool), out,
              err);
}

}  // namespace loom::service
