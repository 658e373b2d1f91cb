// backends/kernel_table.h — a backend's kernels, declared once.
//
// Each entry names a catalog op, the condition under which the backend runs a call of it
// natively (a predicate over the call's dtypes, shapes, layout and attributes), and the
// function that launches it. supports() is derived from the table and launch() reads the
// same table, so the two can never disagree: adding an op to a backend is one entry plus
// its kernel, and a launch of an op the table does not hold is an error naming the op,
// never a silent default. An op may have several entries (e.g. one per element type, or a
// fused kernel with a narrower condition before a general one): the first entry whose
// condition holds runs.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/op_catalog.h"

namespace loom {

template <class Device>
class KernelTable {
 public:
  using Condition = bool (*)(const OpCall& call);
  using Launcher = void (Device::*)(const OpCall& call);  // a member of the backend
  struct Entry {
    OpId op;
    Condition accepts;  // nullptr: every call of `op` that reaches the table
    Launcher launch;
  };

  KernelTable(std::string backend, const std::vector<Entry>& entries)
      : backend_(std::move(backend)) {
    for (const Entry& entry : entries) {
      check(entry.launch != nullptr, [&] {
        return backend_ + ": kernel table entry for op " + std::string(op_name(entry.op)) +
               " has no launcher";
      });
      entries_[index(entry.op)].push_back(entry);
    }
  }

  // True when some entry of call.op accepts the call.
  bool supports(const OpCall& call) const { return find(call) != nullptr; }

  // Runs the first entry of call.op that accepts the call; an error when none does
  // (dispatch asks supports() first, so this is a caller's bug or a table gap).
  void launch(Device& device, const OpCall& call) const {
    const Entry* entry = find(call);
    if (entry == nullptr)
      throw Error(
          backend_ + ": no kernel for op " + std::string(op_name(call.op)) +
          (entries_[index(call.op)].empty()
               ? " (not in the backend's kernel table)"
               : " with these dtypes, shapes or attributes (its entries decline the call)"));
    (device.*(entry->launch))(call);
  }

  // True when the table has any entry for `op` (whatever its conditions).
  bool lists(OpId op) const { return !entries_[index(op)].empty(); }

  // The ops the table lists, in catalog order.
  std::vector<OpId> ops() const {
    std::vector<OpId> listed;
    for (std::size_t i = 0; i < kNumOps; ++i)
      if (!entries_[i].empty())
        listed.push_back(static_cast<OpId>(i));
    return listed;
  }

 private:
  static std::size_t index(OpId op) { return static_cast<std::size_t>(op); }
  const Entry* find(const OpCall& call) const {
    for (const Entry& entry : entries_[index(call.op)])
      if (entry.accepts == nullptr || entry.accepts(call))
        return &entry;
    return nullptr;
  }

  std::string backend_;
  std::array<std::vector<Entry>, kNumOps> entries_;
};

}  // namespace loom
