// dist/grid.h — the processes of a job as a grid of tensor (T), data (D) and pipeline (P)
// parallel groups, in Megatron-Core's order tp-cp-ep-dp-pp (docs/parallel.md): the ranks of a
// tensor-parallel group are adjacent, the stages of a pipeline furthest apart. Context and
// expert parallelism keep their places in that order with size 1 until they are built.
#pragma once

#include <memory>
#include <string>

#include "autograd/tensor_parallel.h"
#include "dist/communicator.h"

namespace loom::dist {

struct GridShape {
  int tp = 1, dp = 1, pp = 1;
  int size() const { return tp * dp * pp; }
  std::string describe() const;  // "tp 2 x dp 2 x pp 1"
};

struct GridCoordinates {
  int tp = 0, dp = 0, pp = 0;
};

// rank = tp + T (dp + D pp).
GridCoordinates grid_coordinates(int rank, const GridShape& shape);
int grid_rank(const GridCoordinates& at, const GridShape& shape);

// The three groups of this rank, split from `world` (collective: every rank of it builds its
// grid together). A shape whose product is not the world's size is an error naming both.
class ProcessGrid {
 public:
  ProcessGrid(Communicator& world, const GridShape& shape);
  const GridShape& shape() const { return shape_; }
  const GridCoordinates& at() const { return at_; }
  Communicator& tp() { return *tp_; }  // same dp and pp; ranked by tp
  Communicator& dp() { return *dp_; }  // same tp and pp; ranked by dp
  Communicator& pp() { return *pp_; }  // same tp and dp; ranked by pp

 private:
  GridShape shape_;
  GridCoordinates at_;
  std::unique_ptr<Communicator> tp_, dp_, pp_;
};

// A communicator as the tensor-parallel group of the autograd rules (TensorGroupScope).
class TensorGroupOf final : public autograd::TensorGroup {
 public:
  explicit TensorGroupOf(Communicator& comm, bool sequence_parallel = false)
      : comm_(comm), sequence_parallel_(sequence_parallel) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce_sum(std::span<float> data) override { comm_.all_reduce_sum(data); }
  void all_gather(std::span<const float> local, std::span<float> all) override {
    comm_.all_gather(local, all);
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> local) override {
    comm_.reduce_scatter_sum(all, local);
  }
  bool sequence_parallel() const override { return sequence_parallel_; }

 private:
  Communicator& comm_;
  bool sequence_parallel_;
};

}  // namespace loom::dist
