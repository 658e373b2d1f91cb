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
  std::int64_t micro_batch = 1;   // sequences per micro-batch
  std::int64_t global_batch = 1;  // sequences per optimizer step
  std::int64_t seq = 2048;
  std::int64_t interleave = 1;  // virtual pipeline stages per chip (1: plain 1F1B)
  Recompute recompute = Recompute::full;
  int zero = 1;  // 0: replicated optimizer; 1: sharded optimizer; 2: + grads; 3: + weights
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
  // Selective recomputation (Korthikanti et al. 2022) exists in the stack: 2021-era
  // Megatron and Megatron-DeepSpeed offered full recomputation or none.
  bool selective_recompute = true;
  // The interleaved 1F1B schedule (virtual pipeline stages, Narayanan et al. 2021) exists
  // in the stack: DeepSpeed's pipeline engine, under Megatron-DeepSpeed, runs plain 1F1B.
  bool interleaved_schedule = true;
  // MoE: the expert all-to-all runs while another micro-batch computes (DualPipe's paired
  // forward and backward chunks; Megatron-Core's 1F1B all-to-all overlap), so only what
  // outlasts that compute is exposed. Off: every byte waits (the 2023-era dispatchers).
  bool overlap_ep = false;
  // Share of the chip's compute units that communication kernels hold while they overlap
  // compute (DeepSeek-V3 sec. 3.2.2: 20 of the H800's 132 SMs); compute runs on the rest.
  double comm_sm_fraction = 0;
  // DeepSeek's DualPipe: micro-batches fed from both ends of the pipeline, bubble
  // (pp/2 - 1)(F&B + B - 3W) instead of 1F1B's (pp - 1)(F + B), two copies of each stage's
  // weights, pp + 1 micro-batches of activations in flight (DeepSeek-V3, Table 2).
  bool dualpipe = false;
  // Tokens on the busiest expert rank over the mean (1: perfectly balanced routing).
  double moe_imbalance = 1.0;
  // The rate of the routed experts' GEMMs as a fraction of dense GEMMs of the same size:
  // what the stack's MoE path (token permutation, per-expert or grouped GEMMs, the router)
  // costs beyond the expert FLOPs. 1 where nothing says otherwise; calibrated for a stack
  // whose published MoE runs show it (MindSpeed-LLM, catalog/calibration/software.yaml).
  double moe_efficiency = 1.0;
  // What the stack always recomputes in the backward pass short of full recomputation
  // (published practice, not a search choice). Norms: the norms' outputs are not kept,
  // only their inputs (DeepSeek-V3 sec. 3.2.3). MLA up-projection: latent attention keeps
  // its latents and recomputes Q, K and V from them, a GEMM's worth of forward FLOPs
  // (DeepSeek-V3 sec. 3.2.3; Megatron-Core's recompute module "mla_up_proj", which
  // Megatron-Bridge's DeepSeek recipes set). MoE activation: the experts keep only the
  // activation's input, at the GEMMs' input precision, and recompute its output, the down
  // projection's input (DeepSeek-V3 sec. 3.3.3, SwiGLU inputs cached in fp8).
  bool recompute_norms = false;
  bool recompute_mla_up_projection = false;
  bool recompute_moe_activation = false;
};

// Memory per chip by component, GB (1e9 bytes).
struct Memory {
  double weights_gb = 0, gradients_gb = 0, optimizer_gb = 0, activations_gb = 0;
  double weights_and_optimizer_gb = 0;  // weights + gradients + optimizer
  double reserve_gb = 0;   // CUDA context, communication buffers, allocator fragmentation
  double total_gb = 0;     // everything above
  double capacity_gb = 0;  // what the chip's HBM holds (its GiB as GB)
  std::int64_t rank = 0;   // the pipeline rank that needs the most
};

// "needs 90.1 GB on pipeline rank 0: weights 6.3, gradients 0.4, ..." for an infeasible plan.
std::string describe_memory(const Memory& m, const std::string& chip_id);

struct Estimate {
  bool feasible = true;
  std::string reason;  // why infeasible, or which figure is unknown
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

Estimate estimate(const Model& model, const Chip& chip, const Layout& layout,
                  const Software& software = {});
// The pipeline rank needing the most memory; capacity_gb is filled when hbm_gib > 0.
Memory memory_per_chip(const Model& model, const Layout& layout, const Software& software = {},
                       double hbm_gib = 0);
Totals totals(const Estimate& e, const Chip& chip, const Layout& layout, double tokens,
              double price_override = -1);

// The chip with every estimated figure (one with low/high bounds) at the bound that makes
// training fastest (`optimistic`: the high peak and bandwidths, the low power) or slowest.
// A plan on a chip with estimates is given as the range between the two.
Chip chip_at_bounds(const Chip& chip, bool optimistic);
bool has_estimates(const Chip& chip);

// Forward FLOPs of one transformer layer (average over dense and MoE layers) for
// `tokens` tokens of sequences of length `seq`; attention counted over the full s x s
// scores, as Megatron does.
double layer_forward_flops(const Model& model, double tokens, double seq);
// The attention core's part of it (Q K^T and the weighted sum of V): 2 s (qk + v) per token.
double attention_core_flops(const Model& model, double tokens, double seq);

// Bytes one token sends per MoE layer and direction of the dispatch all-to-all, over the
// scale-out fabric and within the scale-up domain, for an expert group of tp x ep chips
// with `domain` chips per scale-up domain. With node-limited routing (route_nodes > 0, as
// DeepSeek-V3's 4) a token crosses the fabric once per distinct remote node and is fanned
// out to its experts inside the node; otherwise every copy to a remote chip crosses.
struct AllToAllBytes {
  double scale_out = 0, scale_up = 0;
};
AllToAllBytes moe_dispatch_bytes(const Model& model, const Layout& layout, std::int64_t domain,
                                 double bytes_per_element);

}  // namespace loom::cluster
