// cluster/sched/pool_state — one pool's nodes during a simulation: free chips per node
// (bucketed for best fit), the chips shared by jobs that ask for a share of one, the jobs
// each node holds, and the nodes down for repair. Internal to the simulator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "cluster/sched/fleet.h"
#include "core/error.h"

namespace loom::cluster {

// What a job holds in a pool: chips on nodes, or a share of one shared chip.
struct Holding {
  std::vector<std::pair<std::int64_t, std::int64_t>> nodes;  // (node, chips)
  std::int64_t shared_chip = -1;                             // its share's chip, or -1
  std::int64_t milli = 0;                                    // the share, in thousandths
};

// One pool's nodes, bucketed by their free chips so that best fit is a short scan, with
// the jobs each node holds and which nodes are down for repair. A job asking for a share
// of a chip goes to the shared chip with the least room that fits it (best fit); when
// none has room, a free chip becomes shared (taken from its node by best fit, as a
// one-chip job), and it is whole again when its last share leaves.
class PoolState {
 public:
  static constexpr std::int64_t kWhole = 1000;  // thousandths of a chip
  explicit PoolState(const Pool& pool)
      : per_node_(pool.chips_per_node),
        free_(static_cast<std::size_t>(pool.nodes), pool.chips_per_node),
        position_(static_cast<std::size_t>(pool.nodes)),
        jobs_on_(static_cast<std::size_t>(pool.nodes)),
        down_(static_cast<std::size_t>(pool.nodes), false),
        buckets_(static_cast<std::size_t>(pool.chips_per_node) + 1) {
    for (std::int64_t n = 0; n < pool.nodes; ++n)
      insert(n);
  }

  // Chips a job of `chips` holds here: its own when it fits in a node, else whole nodes.
  std::int64_t footprint(std::int64_t chips) const {
    return chips <= per_node_ ? chips : whole_nodes(chips) * per_node_;
  }
  bool capacity_for(std::int64_t chips, std::int64_t nodes) const {
    return footprint(chips) <= nodes * per_node_;
  }
  // Room for a share of `milli` thousandths of one chip.
  bool fits_share(std::int64_t milli) const {
    return by_room_.lower_bound({milli, -1}) != by_room_.end() || fits(1);
  }
  bool fits(std::int64_t chips) const {
    if (chips > per_node_)
      return whole_nodes(chips) <= static_cast<std::int64_t>(buckets_.back().size());
    for (std::int64_t f = chips; f <= per_node_; ++f)
      if (!buckets_[static_cast<std::size_t>(f)].empty())
        return true;
    return false;
  }
  // The nodes and chips `job` takes; fits(chips) must hold.
  std::vector<std::pair<std::int64_t, std::int64_t>> take(std::int64_t chips, std::size_t job) {
    std::vector<std::pair<std::int64_t, std::int64_t>> taken;
    if (chips > per_node_) {
      for (std::int64_t k = whole_nodes(chips); k > 0; --k) {
        const std::int64_t node = buckets_.back().back();
        move(node, 0);
        taken.push_back({node, per_node_});
      }
    } else {
      for (std::int64_t f = chips; f <= per_node_; ++f) {
        const auto& bucket = buckets_[static_cast<std::size_t>(f)];
        if (bucket.empty())
          continue;
        const std::int64_t node = bucket.back();
        move(node, f - chips);
        taken.push_back({node, chips});
        break;
      }
    }
    check(!taken.empty(), "scheduler: no node has room (fits() was not checked)");
    for (auto [node, n] : taken)
      jobs_on_[static_cast<std::size_t>(node)].push_back(job);
    return taken;
  }
  void give_back(const std::vector<std::pair<std::int64_t, std::int64_t>>& taken, std::size_t job) {
    for (auto [node, chips] : taken) {
      auto& on = jobs_on_[static_cast<std::size_t>(node)];
      on.erase(std::find(on.begin(), on.end(), job));
      std::int64_t now = free_[static_cast<std::size_t>(node)] + chips;
      check(now <= per_node_, "scheduler: a node got back more chips than it has");
      move(node, now);
    }
  }
  // What `job` takes: `chips` chips, or (milli > 0) a share of one; fits()/fits_share()
  // must hold.
  Holding hold(std::int64_t chips, std::int64_t milli, std::size_t job) {
    Holding h;
    if (milli <= 0) {
      h.nodes = take(chips, job);
      return h;
    }
    check(milli < kWhole, "scheduler: a share of a chip must be below 1,000 thousandths");
    auto it = by_room_.lower_bound({milli, -1});
    std::int64_t id = 0;
    if (it != by_room_.end()) {
      id = it->second;
      by_room_.erase(it);
      jobs_on_[static_cast<std::size_t>(shared_[static_cast<std::size_t>(id)].node)].push_back(job);
    } else {  // a whole chip becomes shared
      const std::int64_t node = take(1, job).front().first;
      if (!free_ids_.empty()) {
        id = free_ids_.back();
        free_ids_.pop_back();
      } else {
        id = static_cast<std::int64_t>(shared_.size());
        shared_.push_back({});
      }
      shared_[static_cast<std::size_t>(id)] = {node, kWhole};
    }
    SharedChip& chip = shared_[static_cast<std::size_t>(id)];
    chip.room -= milli;
    by_room_.insert({chip.room, id});
    h.shared_chip = id;
    h.milli = milli;
    return h;
  }
  void release(const Holding& h, std::size_t job) {
    if (h.shared_chip < 0) {
      give_back(h.nodes, job);
      return;
    }
    SharedChip& chip = shared_[static_cast<std::size_t>(h.shared_chip)];
    by_room_.erase({chip.room, h.shared_chip});
    chip.room += h.milli;
    check(chip.room <= kWhole, "scheduler: a shared chip got back more than it has");
    if (chip.room < kWhole) {
      auto& on = jobs_on_[static_cast<std::size_t>(chip.node)];
      on.erase(std::find(on.begin(), on.end(), job));
      by_room_.insert({chip.room, h.shared_chip});
      return;
    }
    give_back({{chip.node, 1}}, job);  // its last share: the chip is whole and free again
    free_ids_.push_back(h.shared_chip);
  }
  std::int64_t nodes() const { return static_cast<std::int64_t>(free_.size()); }
  const std::vector<std::size_t>& jobs_on(std::int64_t node) const {
    return jobs_on_[static_cast<std::size_t>(node)];
  }
  bool is_down(std::int64_t node) const { return down_[static_cast<std::size_t>(node)]; }
  // A node whose jobs have all given their chips back goes down, then comes back up.
  void set_down(std::int64_t node) {
    check(free_[static_cast<std::size_t>(node)] == per_node_ && jobs_on(node).empty(),
          "scheduler: a node went down while holding jobs");
    erase(node);
    down_[static_cast<std::size_t>(node)] = true;
    ++down_count_;
  }
  void set_up(std::int64_t node) {
    down_[static_cast<std::size_t>(node)] = false;
    --down_count_;
    insert(node);
  }
  bool any_free() const {
    return free_nodes_ > 0 || partly_free_ > 0 ||
           (!by_room_.empty() && by_room_.rbegin()->first > 0);
  }
  std::int64_t up_chips() const { return (nodes() - down_count_) * per_node_; }

 private:
  std::int64_t whole_nodes(std::int64_t chips) const { return (chips + per_node_ - 1) / per_node_; }
  void insert(std::int64_t node) {
    auto& bucket = buckets_[static_cast<std::size_t>(free_[static_cast<std::size_t>(node)])];
    position_[static_cast<std::size_t>(node)] = bucket.size();
    bucket.push_back(node);
    count(free_[static_cast<std::size_t>(node)], +1);
  }
  void erase(std::int64_t node) {
    const std::int64_t f = free_[static_cast<std::size_t>(node)];
    auto& bucket = buckets_[static_cast<std::size_t>(f)];
    std::size_t at = position_[static_cast<std::size_t>(node)];
    bucket[at] = bucket.back();
    position_[static_cast<std::size_t>(bucket[at])] = at;
    bucket.pop_back();
    count(f, -1);
  }
  void move(std::int64_t node, std::int64_t free_now) {
    erase(node);
    free_[static_cast<std::size_t>(node)] = free_now;
    insert(node);
  }
  void count(std::int64_t free, int delta) {
    if (free == per_node_)
      free_nodes_ += delta;
    else if (free > 0)
      partly_free_ += delta;
  }

  std::int64_t per_node_;
  std::vector<std::int64_t> free_;
  std::vector<std::size_t> position_;
  std::vector<std::vector<std::size_t>> jobs_on_;
  std::vector<bool> down_;
  std::vector<std::vector<std::int64_t>> buckets_;
  std::int64_t free_nodes_ = 0, partly_free_ = 0, down_count_ = 0;
  struct SharedChip {
    std::int64_t node = 0, room = 0;  // room: thousandths still free
  };
  std::vector<SharedChip> shared_;                           // by id
  std::vector<std::int64_t> free_ids_;                       // ids of chips whole again
  std::set<std::pair<std::int64_t, std::int64_t>> by_room_;  // (room, id) of shared chips
};

}  // namespace loom::cluster
