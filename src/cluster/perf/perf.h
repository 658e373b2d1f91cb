// cluster/perf — a performance model of one distributed training step.
//
// For (model, chip, count, layout) it gives FLOPs (model vs hardware, recomputation
// kept apart), memory per chip with feasibility, and a step time split into compute,
// exposed communication and pipeline bubble. Plain functions, no I/O: the scheduler
// calls estimate() thousands of times a second.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/catalog/catalog.h"

namespace loom::cluster {

enum class Recompute { none, selective, full };
enum class Precision { bf16, fp8 };  // the GEMM input type; master weights stay fp32
Precision parse_precision(const std::string& text);
const char* precision_name(Precision p);
Recompute parse_recompute(const std::string& text);  // throws naming the value
const char* recompute_name(Recompute r);

struct Layout {
  std::int64_t tp = 1, pp = 1, dp = 1, ep = 1, cp = 1;
  std::int64_t micro_batch = 1;    // sequences per micro-batch
  std::int64_t global_batch = 1;   // sequences per optimizer step
  std::int64_t seq = 2048;
  std::int64_t interleave = 1;     // virtual pipeline stages per chip (1: plain 1F1B)
  Recompute recompute = Recompute::full;
  int zero = 1;                    // 0: replicated optimizer; 1: sharded optimizer; 2: + grads; 3: + weights
  Precision precision = Precision::bf16;
  // Layers on each virtual pipeline stage, pp x interleave of them in order (virtual stage
  // k runs on pipeline rank k % pp), as a run publishes them (Llama 3 405B: 126 layers on
  // 16 stages, the first and the last with 7); empty: the balanced split (stage_layers).
  std::vector<std::int64_t> stages = {};
  std::int64_t chips() const { return tp * pp * dp * cp; }
};

// What the software does (facts of a stack, not tuning knobs).
struct Software {
  bool flash_attention = true;    // attention scores never materialised
  bool sequence_parallel = true;  // norms and dropout sharded across the TP group
  bool overlap_dp = true;         // gradient reduction overlapped with the backward pass
};

struct Memory {
  double weights_and_optimizer_gb = 0, activations_gb = 0, total_gb = 0;
};

struct Estimate {
  bool feasible = true;
  std::string reason;            // why infeasible, or which figure is unknown
  double step_time_s = 0, compute_s = 0, exposed_comm_s = 0, bubble_s = 0;
  double model_flops = 0, hardware_flops = 0;  // per step, whole job
  double mfu = 0, tflops_per_chip = 0, hw_tflops_per_chip = 0, tokens_per_s = 0;
  Memory memory;
};

// The whole-job totals for training on `tokens` tokens.
struct Totals {
  double steps = 0, days = 0, chip_hours = 0, energy_kwh = 0, cost_usd = 0;
  bool energy_known = true, cost_known = true;
};

// The layers each pipeline rank holds (pp of them, summed over its virtual stages): the
// layout's own split, or the balanced one: L layers over S = pp x interleave virtual
// stages, L / S each and one more on L % S of them; the stages with one fewer are taken
// from both ends first (the first holds the embedding, the last the output layer), as
// Llama 3 405B's 126 layers on 16 stages (7, 8 x 14, 7). Needs a valid layout.
std::vector<std::int64_t> stage_layers(const Model& model, const Layout& layout);

// Empty when valid, else why (TP not dividing heads, fewer layers than pipeline stages, ...).
std::string check_layout(const Model& model, const Chip& chip, const Layout& layout);

Estimate estimate(const Model& model, const Chip& chip, const Layout& layout, const Software& software = {});
Memory memory_per_chip(const Model& model, const Layout& layout, const Software& software = {});
Totals totals(const Estimate& e, const Chip& chip, const Layout& layout, double tokens, double price_override = -1);

// Forward FLOPs of one transformer layer (average over dense and MoE layers) for
// `tokens` tokens of sequences of length `seq`; attention counted over the full s x s
// scores, as Megatron does.
double layer_forward_flops(const Model& model, double tokens, double seq);

}  // namespace loom::cluster
