// train/checkpoint_store.h — where a run's checkpoints live, and how one appears whole or
// not at all:
//
//   OUT/checkpoints/step-00000500/   one complete checkpoint (checkpoint.h's two files, or a
//                                    sharded one: sharded_checkpoint.h's index and shards)
//   OUT/checkpoint -> checkpoints/step-00000500   the newest, a symbolic link
//
// A checkpoint is written into a temporary folder, its files and the folder are synced,
// and only then is it renamed to its step's name; the link is replaced by renaming a new
// link over it. rename(2) is atomic, so a process killed at any instant (kill -9, power
// loss after the syncs) leaves every step-* folder complete and the link pointing at one
// of them (or missing, before the first). Older checkpoints, and the temporary folders of
// a writer killed mid-checkpoint, are removed only after the new one is in place. `loom sample
// OUT/checkpoint` and `loom eval` follow the link.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace loom::train {

class CheckpointStore {
 public:
  // Checkpoints of the run writing into `out`; `keep` complete checkpoints are kept.
  explicit CheckpointStore(std::string out, int keep = 2);

  // Writes the checkpoint of `step` steps: `write(folder)` puts its files in a fresh
  // temporary folder; then it is synced, renamed into place and published as the newest.
  void publish(std::int64_t step, const std::function<void(const std::string& folder)>& write);
  // The same in two parts, for checkpoints several processes write: prepare() makes the
  // fresh temporary folder of `step` (its name is the same for every process: writing_folder);
  // once every file is in it, commit() syncs it, renames it into place and publishes it.
  std::string prepare(std::int64_t step);
  std::string writing_folder(std::int64_t step) const;
  void commit(std::int64_t step);

  // The folder of the newest complete checkpoint: the link's target, else (the link
  // missing or dangling after a crash) the highest step-* folder; empty when there is none.
  // OUT/checkpoint as a plain folder (checkpoints of older Loom versions) is used as it is.
  std::string newest() const;

  std::string link_path() const { return out_ + "/checkpoint"; }
  std::string folder_of(std::int64_t step) const;

 private:
  void remove_older_than(std::int64_t step) const;

  std::string out_;
  int keep_;
};

}  // namespace loom::train
