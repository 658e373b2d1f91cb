// dist/pipeline.h — pipeline parallelism for the decoder (every family): the ranks of a
// pipeline group are the stages.
//
// Stage s holds blocks [first, last) of the model (stage 0 also the embeddings, the last
// stage the final norm, the LM head and the loss); the blocks split evenly or as the run
// says (`stages = 3,5`). A batch is cut into micro-batches
// that flow through the stages (1F1B or GPipe schedule); activations go to the next
// stage and their gradients come back. A tied LM head
// shares the token embedding with stage 0, so those two stages add their gradients of it.
// Under tensor parallelism each stage's ranks run their slices (the caller's
// TensorGroupScope) and talk to the same tensor-parallel rank of the next stage.
// The result is the gradient one process computes for the whole batch (up to the order
// of float additions), so the optimizer step is unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "data/text.h"
#include "dist/communicator.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace loom::dist {

// GPipe: every forward, then every backward (holds all M micro-batches' activations).
// 1F1B: after a warm-up, one forward then one backward (holds at most S). Both compute
// the same gradients, bitwise: backwards run in micro-batch order either way.
enum class PipelineSchedule { gpipe, one_f_one_b };

// Blocks per stage: `counts` when given (one positive count per stage, summing to the
// model's layers; errors name the setting), else as even as the count allows (the first
// layers % stages stages take one more).
std::vector<std::int64_t> stage_blocks(std::int64_t layers, int stages,
                                       const std::vector<std::int64_t>& counts);

class Pipeline {
 public:
  // One stage per rank of `comm`, holding `blocks_per_stage[rank]` blocks (stage_blocks).
  Pipeline(Communicator& comm, nn::Decoder& model, std::int64_t micro_batches,
           PipelineSchedule schedule = PipelineSchedule::one_f_one_b,
           const std::vector<std::int64_t>& blocks_per_stage = {});

  int stage() const { return comm_.rank(); }
  int stages() const { return comm_.size(); }
  std::int64_t micro_batches() const { return micro_batches_; }
  const std::vector<std::int64_t>& stage_blocks() const { return blocks_; }
  std::int64_t first_block() const { return first_; }
  std::int64_t last_block() const { return last_; }

  // Forward and backward of every micro-batch of `batch` (the whole batch, the same on
  // every rank). Afterwards this stage's parameters hold the gradient of the batch's mean
  // loss. Returns that loss, on every rank.
  double forward_backward(const data::Batch& batch, const nn::ForwardOptions& options);

  // Parameter i is computed with on this stage / its values are this stage's to keep (the
  // lowest stage using it): global-norm clipping counts each parameter at its owner.
  bool uses(std::size_t i) const { return used_[i]; }
  bool owns(std::size_t i) const { return owner_[i] == stage(); }
  int owner(std::size_t i) const { return owner_[i]; }

  // Every rank receives the owning stage's parameter values (and the optimizer's moments
  // when given), so any rank holds the whole model: before evaluating or saving.
  void gather_to_all(optim::AdamW* optimizer);

 private:
  Communicator& comm_;
  nn::Decoder& model_;
  std::int64_t micro_batches_;
  PipelineSchedule schedule_;
  std::vector<std::int64_t> blocks_;  // per stage
  std::int64_t first_ = 0, last_ = 0;
  std::vector<bool> used_;  // per parameter: this stage computes with it
  std::vector<int> owner_;  // per parameter: the stage whose values are the truth
};

}  // namespace loom::dist
