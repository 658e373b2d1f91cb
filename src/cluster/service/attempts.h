// cluster/service/attempts — one attempt of a job: a `loom train` process on this machine,
// launched so that the fleet service can crash and restart at any instant without losing
// the job or starting it twice.
//
// Files of attempt K in the job's folder:
//   attempt-K.lock   flock(2)ed from before the process exists until its last process
//                    exits: held = alive. The service takes the lock before fork(), and
//                    the supervisor and the training process inherit it, so there is no
//                    instant at which a live attempt looks dead.
//   attempt-K.log    the attempt's output
//   attempt-K.exit   its exit status, written atomically by the supervisor at the end
//   records.jsonl    the job's own start and end records, appended (and synced) by the
//                    supervisors: {"attempt": K, "event": "start"|"end", "pid", "exit", "time"}
// An attempt whose lock is free and that has no exit record was lost (killed with its
// supervisor, or never started): the job resumes from its last checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::service {

struct AttemptFiles {
  std::string dir;  // the job's folder
  std::int64_t number = 1;
  std::string lock() const { return dir + "/attempt-" + std::to_string(number) + ".lock"; }
  std::string log() const { return dir + "/attempt-" + std::to_string(number) + ".log"; }
  std::string exit_record() const { return dir + "/attempt-" + std::to_string(number) + ".exit"; }
  std::string records() const { return dir + "/records.jsonl"; }
};

// Starts attempt `files` in a new session (it outlives the service): `loom fleet
// supervise` runs `command` (argv, the loom binary first) and records its end. Returns
// the supervisor's pid, which is also the attempt's process group.
std::int64_t launch_attempt(const std::string& loom, const AttemptFiles& files,
                            const std::vector<std::string>& command);

struct AttemptStatus {
  enum class State { alive, exited, lost } state = State::lost;
  std::optional<int> exit_code;     // exited
  std::optional<std::int64_t> pid;  // the supervisor's, from its start record
};
// Whether the attempt is alive, exited (with its status) or lost. Takes the lock for an
// instant when it is free, which no live attempt can hold.
AttemptStatus probe_attempt(const AttemptFiles& files);

// Signals the attempt's process group (the supervisor and the training process).
void signal_attempt(std::int64_t pid, int signal);

// The supervisor (`loom fleet supervise`): records the start, runs `command` with the
// inherited lock, waits, records the exit status and the end. SIGTERM and SIGINT reach the
// training process through the group; the supervisor itself outlives them to record the
// end. Returns 0 once the records are written.
int supervise(const AttemptFiles& files, const std::vector<std::string>& command);

// Writes `contents` to `path` atomically (temporary file, fsync, rename, fsync folder).
void write_atomically(const std::string& path, const std::string& contents);
// Appends one line and syncs it to disk.
void append_synced(const std::string& path, const std::string& line);

double wall_seconds();  // seconds since the epoch

}  // namespace loom::service
