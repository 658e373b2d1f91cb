#include "dist/local_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "core/error.h"

namespace loom::dist {
namespace {

// What the ranks of one group share. A collective is two meetings: at the first every rank
// has posted its buffers, so each computes its own result reading the others'; at the second
// every rank has finished reading, so the buffers may change again.
struct GroupState {
  GroupState(int n, std::chrono::milliseconds t)
      : size(n),
        timeout(t),
        posted(static_cast<std::size_t>(n)),
        splits(static_cast<std::size_t>(n)) {}

  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  std::uint64_t meetings = 0;
  std::string broken;                       // what failed; once set, every call fails
  std::vector<const void*> posted;          // per rank, the buffer of the collective under way
  std::vector<std::pair<int, int>> splits;  // per rank, (color, key) of a split under way
  std::map<int, std::shared_ptr<GroupState>> new_groups;               // by color, during a split
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mail;  // (from, to)

  void fail_if_broken(int rank, const char* what) const {
    if (!broken.empty())
      throw Error("local group: " + std::string(what) + " on rank " + std::to_string(rank) +
                  ": the group is broken (" + broken + ")");
  }

  // Every rank arrives before any leaves.
  void meet(int rank, const char* what) {
    std::unique_lock lock(mutex);
    fail_if_broken(rank, what);
    const std::uint64_t meeting = meetings;
    if (++arrived == size) {
      arrived = 0;
      ++meetings;
      changed.notify_all();
      return;
    }
    if (!changed.wait_for(lock, timeout, [&] { return meetings != meeting || !broken.empty(); })) {
      broken = std::string(what) + ": " + std::to_string(size - arrived) + " of " +
               std::to_string(size) + " ranks did not arrive within " +
               std::to_string(timeout.count()) + " ms";
      changed.notify_all();
    }
    fail_if_broken(rank, what);
  }
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<GroupState> state, int rank)
      : state_(std::move(state)), rank_(rank) {}
  std::string_view name() const override { return "local"; }
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }

  void all_reduce_sum(std::span<float> data) override {
    std::vector<float> sum(data.size(), 0.0f);
    collective("all_reduce", data.data(), [&](int r, const void* posted) {
      const float* in = static_cast<const float*>(posted);
      for (std::size_t i = 0; i < sum.size(); ++i)
        sum[i] = r == 0 ? in[i] : sum[i] + in[i];
    });
    std::copy(sum.begin(), sum.end(), data.begin());
  }
  void all_gather(std::span<const float> local, std::span<float> all) override {
    check(all.size() == local.size() * static_cast<std::size_t>(size()),
          "all_gather: " + std::to_string(all.size()) + " floats are not " +
              std::to_string(size()) + " parts of " + std::to_string(local.size()));
    collective("all_gather", local.data(), [&](int r, const void* posted) {
      std::memcpy(all.data() + local.size() * static_cast<std::size_t>(r), posted,
                  local.size() * sizeof(float));
    });
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> local) override {
    check(all.size() == local.size() * static_cast<std::size_t>(size()),
          "reduce_scatter_sum: " + std::to_string(all.size()) + " floats are not " +
              std::to_string(size()) + " parts of " + std::to_string(local.size()));
    const std::size_t at = local.size() * static_cast<std::size_t>(rank_);
    collective("reduce_scatter", all.data(), [&](int r, const void* posted) {
      const float* in = static_cast<const float*>(posted) + at;
      for (std::size_t i = 0; i < local.size(); ++i)
        local[i] = r == 0 ? in[i] : local[i] + in[i];
    });
  }
  void broadcast(std::span<std::byte> data, int root) override {
    check(root >= 0 && root < size(), "broadcast from rank " + std::to_string(root) +
                                          " in a group of " + std::to_string(size()));
    collective("broadcast", data.data(), [&](int r, const void* posted) {
      if (r == root && r != rank_)
        std::memcpy(data.data(), posted, data.size());
    });
  }
  void send(std::span<const float> data, int dest) override {
    check(dest >= 0 && dest < size() && dest != rank_,
          "send to rank " + std::to_string(dest) + " from rank " + std::to_string(rank_) +
              " in a group of " + std::to_string(size()));
    std::lock_guard lock(state_->mutex);
    state_->fail_if_broken(rank_, "send");
    state_->mail[{rank_, dest}].emplace_back(data.begin(), data.end());
    state_->changed.notify_all();
  }
  void receive(std::span<float> data, int source) override {
    check(source >= 0 && source < size() && source != rank_,
          "receive from rank " + std::to_string(source) + " on rank " + std::to_string(rank_) +
              " in a group of " + std::to_string(size()));
    std::unique_lock lock(state_->mutex);
    auto& box = state_->mail[{source, rank_}];
    if (!state_->changed.wait_for(lock, state_->timeout,
                                  [&] { return !box.empty() || !state_->broken.empty(); })) {
      state_->broken = "receive on rank " + std::to_string(rank_) + ": nothing came from rank " +
                       std::to_string(source) + " within " +
                       std::to_string(state_->timeout.count()) + " ms";
      state_->changed.notify_all();
    }
    state_->fail_if_broken(rank_, "receive");
    check(box.front().size() == data.size(),
          "receive on rank " + std::to_string(rank_) + ": " + std::to_string(box.front().size()) +
              " floats came from rank " + std::to_string(source) + ", " +
              std::to_string(data.size()) + " were expected");
    std::copy(box.front().begin(), box.front().end(), data.begin());
    box.pop_front();
  }
  // Sends are buffered here, so sending first cannot block the exchange.
  void send_receive(std::span<const float> send_data, int dest, std::span<float> receive_data,
                    int source) override {
    send(send_data, dest);
    receive(receive_data, source);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    GroupState& s = *state_;
    {
      std::lock_guard lock(s.mutex);
      s.splits[static_cast<std::size_t>(rank_)] = {color, key};
    }
    s.meet(rank_, "split");
    std::vector<std::pair<int, int>> members;  // (key, rank) of this color's ranks
    for (int r = 0; r < s.size; ++r)
      if (s.splits[static_cast<std::size_t>(r)].first == color)
        members.emplace_back(s.splits[static_cast<std::size_t>(r)].second, r);
    std::sort(members.begin(), members.end());
    const int new_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin());
    std::shared_ptr<GroupState> group;
    {
      std::lock_guard lock(s.mutex);
      auto& slot = s.new_groups[color];
      if (!slot)
        slot = std::make_shared<GroupState>(static_cast<int>(members.size()), s.timeout);
      group = slot;
    }
    s.meet(rank_, "split");
    if (rank_ == 0) {  // every rank holds its group: clear before anyone can split again
      std::lock_guard lock(s.mutex);
      s.new_groups.clear();
    }
    s.meet(rank_, "split");
    return std::make_unique<LocalCommunicator>(std::move(group), new_rank);
  }

 private:
  // Posts `mine`, then reads every rank's posting in rank order with read(rank, posting).
  template <class Read>
  void collective(const char* what, const void* mine, Read read) {
    GroupState& s = *state_;
    {
      std::lock_guard lock(s.mutex);
      s.posted[static_cast<std::size_t>(rank_)] = mine;
    }
    s.meet(rank_, what);
    for (int r = 0; r < s.size; ++r)
      read(r, s.posted[static_cast<std::size_t>(r)]);
    s.meet(rank_, what);
  }

  std::shared_ptr<GroupState> state_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> local_group(int size,
                                                       std::chrono::milliseconds timeout) {
  check(size >= 1, "local_group: size " + std::to_string(size) + ", expected >= 1");
  auto state = std::make_shared<GroupState>(size, timeout);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < size; ++r)
    ranks.push_back(std::make_unique<LocalCommunicator>(state, r));
  return ranks;
}

}  // namespace loom::dist
