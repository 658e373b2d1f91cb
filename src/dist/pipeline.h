// dist/pipeline.h — pipeline parallelism for GPT: the job's processes are the stages.
//
// Stage s holds blocks [first, last) of the model (stage 0 also the embeddings, the last
// stage the final LayerNorm, the LM head and the loss). A batch is cut into micro-batches
// that flow through the stages (1F1B or GPipe schedule); activations go to the next
// stage and their gradients come back. The LM head
// shares the token embedding with stage 0, so those two stages add their gradients of it.
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

class GptPipeline {
 public:
  // One stage per rank of `comm`; blocks are split as evenly as the count allows.
  GptPipeline(Communicator& comm, nn::Decoder& model, std::int64_t micro_batches,
              PipelineSchedule schedule = PipelineSchedule::one_f_one_b);

  int stage() const { return comm_.rank(); }
  int stages() const { return comm_.size(); }
  std::int64_t first_block() const { return first_; }
  std::int64_t last_block() const { return last_; }

  // Forward and backward of every micro-batch of `batch` (the whole batch, the same on
  // every rank). Afterwards this stage's parameters hold the gradient of the batch's mean
  // loss. Returns that loss, on every rank.
  double forward_backward(const data::Batch& batch, const nn::ForwardOptions& options);

  // Global-norm clipping over all stages, each parameter counted once. Returns the norm.
  double clip_grad_norm(double max_norm);

  // Every rank receives the owning stage's parameter values (and the optimizer's moments
  // when given), so any rank holds the whole model: before evaluating or saving.
  void gather_to_all(optim::AdamW* optimizer);

 private:
  Communicator& comm_;
  nn::Decoder& model_;
  std::int64_t micro_batches_;
  PipelineSchedule schedule_;
  std::int64_t first_ = 0, last_ = 0;
  std::vector<std::size_t> used_;  // parameter indices this stage computes with
  std::vector<int> owner_;         // per parameter: the stage whose values are the truth
};

}  // namespace loom::dist
