#include "train/checkpoint_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStepPrefix = "step-";

// Flushes a file's or folder's data and metadata to the disk (a folder: its entries, so
// a rename inside it survives a power loss).
void sync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, path + ": cannot open to sync it to disk");
  int rc = ::fsync(fd);
  ::close(fd);
  check(rc == 0, path + ": fsync failed");
}

// The step of a folder named step-NNNNNNNN, or -1 for any other name.
std::int64_t step_of_name(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0 || name.size() == std::char_traits<char>::length(kStepPrefix))
    return -1;
  std::int64_t step = 0;
  for (char c : name.substr(std::char_traits<char>::length(kStepPrefix))) {
    if (c < '0' || c > '9' || step > (INT64_MAX - 9) / 10)
      return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

bool holds_checkpoint(const fs::path& folder) {
  std::error_code ec;
  return (fs::is_regular_file(folder / "model.safetensors", ec) &&
          fs::is_regular_file(folder / "train_state.safetensors", ec)) ||
         fs::is_regular_file(folder / "index.json", ec);
}

}  // namespace

CheckpointStore::CheckpointStore(std::string out, int keep) : out_(std::move(out)), keep_(keep) {
  check(keep_ >= 1, "keep_checkpoints = " + std::to_string(keep_) + ", expected >= 1");
}

std::string CheckpointStore::folder_of(std::int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return out_ + "/checkpoints/" + name;
}

std::string CheckpointStore::writing_folder(std::int64_t step) const {
  return out_ + "/checkpoints/.writing-" + std::to_string(step);
}

std::string CheckpointStore::prepare(std::int64_t step) {
  const std::string root = out_ + "/checkpoints";
  std::error_code ec;
  fs::create_directories(root, ec);
  check(!ec, root + ": cannot create the checkpoint folder: " + ec.message());
  const std::string temp = writing_folder(step);
  fs::remove_all(temp, ec);  // of a writer killed mid-checkpoint at this step
  fs::create_directory(temp, ec);
  check(!ec, temp + ": cannot create: " + ec.message());
  return temp;
}

void CheckpointStore::publish(std::int64_t step,
                              const std::function<void(const std::string& folder)>& write) {
  write(prepare(step));  // each file is itself written to a temporary name, synced and renamed
  commit(step);
}

void CheckpointStore::commit(std::int64_t step) {
  const std::string root = out_ + "/checkpoints";
  std::error_code ec;
  const std::string final_folder = folder_of(step), temp = writing_folder(step);
  sync_path(temp);
  // A checkpoint of this step may exist already (a run stopped and resumed at the same
  // step): set it aside first, since rename(2) does not replace a non-empty folder.
  if (fs::exists(final_folder, ec)) {
    const std::string old = temp + ".replaced";
    fs::remove_all(old, ec);
    fs::rename(final_folder, old, ec);
    check(!ec, final_folder + ": cannot move the earlier checkpoint aside: " + ec.message());
    fs::rename(temp, final_folder, ec);
    check(!ec, final_folder + ": cannot rename the new checkpoint into place: " + ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(temp, final_folder, ec);
    check(!ec, final_folder + ": cannot rename the new checkpoint into place: " + ec.message());
  }
  sync_path(root);
  // Publish: a new link renamed over the old one. A plain folder of an older Loom version
  // cannot be renamed over; it is removed first (the step-* folders remain to resume from).
  const std::string link = link_path(), link_temp = link + ".new-" + std::to_string(::getpid());
  if (fs::is_directory(fs::symlink_status(link, ec)))
    fs::remove_all(link, ec);
  fs::remove(link_temp, ec);
  fs::create_directory_symlink(fs::path("checkpoints") / fs::path(final_folder).filename(),
                               link_temp, ec);
  check(!ec, link_temp + ": cannot create the link to the newest checkpoint: " + ec.message());
  fs::rename(link_temp, link, ec);
  check(!ec, link + ": cannot publish the newest checkpoint: " + ec.message());
  sync_path(out_);
  remove_older_than(step);
}

void CheckpointStore::remove_older_than(std::int64_t step) const {
  std::error_code ec;
  std::vector<std::int64_t> steps;
  std::vector<fs::path> leftovers;  // of writers killed mid-checkpoint (one writer at a time)
  for (const auto& entry : fs::directory_iterator(out_ + "/checkpoints", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".writing-", 0) == 0)
      leftovers.push_back(entry.path());
    std::int64_t s = step_of_name(name);
    if (s >= 0 && s < step)
      steps.push_back(s);
  }
  for (const auto& entry : fs::directory_iterator(out_, ec))
    if (entry.path().filename().string().rfind("checkpoint.new-", 0) == 0)
      leftovers.push_back(entry.path());
  for (const fs::path& leftover : leftovers)
    fs::remove_all(leftover, ec);
  std::sort(steps.begin(), steps.end());
  // The newest `keep_ - 1` older ones stay beside the one just published.
  const std::size_t remove = steps.size() > static_cast<std::size_t>(keep_ - 1)
                                 ? steps.size() - static_cast<std::size_t>(keep_ - 1)
                                 : 0;
  for (std::size_t i = 0; i < remove; ++i)
    fs::remove_all(folder_of(steps[i]), ec);
}

std::string CheckpointStore::newest() const {
  std::error_code ec;
  const fs::path link = link_path();
  if (holds_checkpoint(link))
    return link.string();
  std::int64_t best = -1;
  for (const auto& entry : fs::directory_iterator(out_ + "/checkpoints", ec)) {
    std::int64_t s = step_of_name(entry.path().filename().string());
    if (s > best && holds_checkpoint(entry.path()))
      best = s;
  }
  return best >= 0 ? folder_of(best) : std::string();
}

}  // namespace loom::train
