#include "cluster/perf/perf.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::cluster {
namespace {

// ---- physics constants (one setting for every chip; bench/RESULTS.md shows the fit) ----
// GEMM efficiency rises with work per GEMM: eff = gemm_efficiency * x / (x + kGemmHalf),
// x = tokens per chip per micro-batch * hidden / tp (elements of one activation matrix).
constexpr double kGemmHalf = 8e5;
// Memory-bound elementwise work per layer forward: passes over h-sized activations
// (layer norms, bias, GELU, dropout, residuals), and over the attention scores when
// they are materialised (scale-mask-softmax and dropout), each 2-byte elements.
constexpr double kActivationPasses = 14;
constexpr double kScorePasses = 4.5;
constexpr double kMemoryEfficiency = 0.8;  // achieved / peak HBM bandwidth
constexpr double kLinkEfficiency = 0.75;   // achieved / peak link bandwidth (NCCL bus bandwidth)
constexpr double kScaleUpLatency = 5e-6;   // s per ring step
constexpr double kScaleOutLatency = 10e-6;

struct Links {
  double up_bytes_s, out_bytes_s;
  std::int64_t domain;
};

double ring_allreduce(double bytes, std::int64_t n, double bw, double alpha) {
  if (n <= 1) return 0.0;
  double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  return 2.0 * frac * bytes / (bw * kLinkEfficiency) + 2.0 * static_cast<double>(n - 1) * alpha;
}

// Bytes per parameter of weights, gradients and optimizer: bf16 weights (2), fp32
// gradients (4), fp32 master weights and Adam moments (12), as Megatron's theoretical
// memory formula; ZeRO stage 1 shards the optimizer over the `shards` chips that hold
// the same parameter, 2 the gradients too, 3 the weights too.
struct ParamBytes {
  double weights, gradients, optimizer;
  double total() const { return weights + gradients + optimizer; }
};
ParamBytes param_bytes(int zero, std::int64_t shards) {
  const double d = static_cast<double>(shards);
  return {zero >= 3 ? 2.0 / d : 2.0, zero >= 2 ? 4.0 / d : 4.0, zero >= 1 ? 12.0 / d : 12.0};
}

// The tensor-parallel width of each expert: tp when experts shard across data parallel,
// 1 when they are folded over tp x cp x dp (ep does not divide dp).
std::int64_t expert_tp(const Layout& l) { return l.dp % l.ep == 0 ? l.tp : 1; }

// How many chips hold a copy of the same parameter shard: the group its gradients are
// reduced over and its optimizer state is sharded across. Context-parallel ranks hold the
// same weights as data-parallel ones, so dense parameters are replicated over dp x cp
// (Megatron-Core builds its distributed optimizer and gradient buffers on the data-parallel
// group with context parallelism); an expert shard over the expert-data-parallel group,
// the tp x cp x dp chips of a pipeline stage over the ep x expert-tp that split the experts.
std::int64_t dense_replicas(const Layout& l) { return l.dp * l.cp; }
std::int64_t expert_replicas(const Layout& l) {
  return std::max<std::int64_t>(1, l.tp * l.cp * l.dp / (l.ep * expert_tp(l)));
}

// Copies of each key/value head in a TP group: with fewer kv heads G than TP ranks T (T a
// multiple of G), T/G ranks hold each head, the one their query heads use (Loom's engine,
// docs/parallel.md); otherwise each rank holds G/T heads of its own. Their weights, the
// projections' FLOPs and K and V then cost T/G times their even share.
double kv_copies(const Model& m, const Layout& l) {
  return !m.mla() && l.tp > m.kv_heads ? static_cast<double>(l.tp) / static_cast<double>(m.kv_heads) : 1.0;
}

// Parameters held by one chip of a pipeline stage of `layers` layers: the dense part
// (attention, dense MLPs, shared experts, the embedding on the first stage) split over tp,
// and the routed experts split over ep x expert-tp. A shared expert sees every token, so
// it is sharded like a dense MLP (Megatron-Core's SharedExpertMLP), not over ep.
struct ChipParams {
  double dense = 0, expert = 0;
  double total() const { return dense + expert; }
};
ChipParams params_per_chip(const Model& m, const Layout& l, double layers, bool first) {
  const double dense_share = m.dense_share();
  double per_layer = m.attention_params() + (kv_copies(m, l) - 1.0) * m.kv_projection_params() +
                     dense_share * m.dense_mlp_params() +
                     (1.0 - dense_share) * static_cast<double>(m.shared_experts) * m.expert_params();
  double experts = (1.0 - dense_share) * static_cast<double>(m.experts) * m.expert_params() /
                   static_cast<double>(l.ep * expert_tp(l));
  double embedding = first ? static_cast<double>(m.vocab) * static_cast<double>(m.hidden) : 0.0;
  return {(layers * per_layer + embedding) / static_cast<double>(l.tp), layers * experts};
}

// The parameters of the pipeline rank that holds the most (its gradients are what data
// parallel reduces).
ChipParams max_params_per_chip(const Model& m, const Layout& l, const std::vector<std::int64_t>& stages) {
  ChipParams most;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    ChipParams p = params_per_chip(m, l, static_cast<double>(stages[i]), i == 0);
    if (p.total() > most.total()) most = p;
  }
  return most;
}

// Bytes of activations one token leaves per layer for the backward pass, on one chip of
// the TP group; the tensors of Korthikanti et al. 2022 (Table 2) counted one by one so that
// grouped KV heads, SwiGLU, latent attention, experts and the absence of dropout show:
// 2-byte elements, 1-byte dropout masks.
// Under fp8 training a linear layer keeps its input for the weight gradient in fp8, 1 byte
// an element (Transformer Engine's Linear and LayerNormLinear save the quantised input,
// not the bf16 one; DeepSeek-V3 sec. 3.3.3 caches "the activations in FP8 for the Linear
// operators' backward pass"). Tensors that are also read in bf16 by a non-GEMM backward
// (the attention core's output, which FlashAttention's backward reads) keep their bf16
// copy beside the fp8 one.
double activation_bytes_per_token(const Model& m, const Layout& l, const Software& sw) {
  const double h = static_cast<double>(m.hidden), t = static_cast<double>(l.tp);
  const double drop = m.dropout ? 1.0 : 0.0;
  if (l.recompute == Recompute::full)  // only the layer's input
    return 2.0 * h / (sw.sequence_parallel ? t : 1.0);
  const bool fp8 = l.precision == Precision::fp8;
  const double gemm_input = fp8 ? 1.0 : 2.0;  // bytes per element of a saved linear input
  // Whole-width tensors: the two norms' inputs, the attention's and the MLP's inputs (the
  // norms' outputs, each a linear input), the two dropout masks. Sequence parallelism
  // splits them across TP.
  const double norm_outputs = sw.recompute_norms ? 0.0 : 2.0 * gemm_input * h;
  const double whole = 4.0 * h + norm_outputs + 2.0 * drop * h;
  // Head- or column-split tensors. Attention: Q, K, V and the core's output (the output
  // projection's input; under fp8 also its fp8 copy); latent attention keeps its latents
  // (the up-projections' inputs) too.
  const double core_output = 2.0 * m.v_width() + (fp8 ? m.v_width() : 0.0);
  double attention = 0;
  if (m.mla()) {
    // The latents are the up-projections' inputs, or, when the norms between are
    // recomputed, the norms' inputs (bf16). Recomputed up-projections keep no Q, K, V.
    const double latents = static_cast<double>(m.q_lora_rank + m.kv_lora_rank + m.qk_rope_dim);
    attention = (sw.recompute_norms ? 2.0 : gemm_input) * latents + core_output;
    if (!sw.recompute_mla_up_projection)
      attention += 2.0 * m.qk_width() * 2.0 + 2.0 * m.v_width();
  } else {
    const double kv = m.qk_width() * static_cast<double>(m.kv_heads) / static_cast<double>(m.heads);
    attention = 2.0 * m.qk_width() + 2.0 * 2.0 * kv * kv_copies(m, l) + core_output;
  }
  // Materialised scores: softmax input and output (2 bytes each) and their dropout mask,
  // 5 a s per token; selective recomputation drops them (its whole point).
  if (!sw.flash_attention && l.recompute == Recompute::none)
    attention += 5.0 * static_cast<double>(m.heads) * static_cast<double>(l.seq);
  // MLP: the activation's input (bf16) and the down projection's input (a linear input).
  // GELU: 2f + 2f; SwiGLU: gate 2f, up 2f, product 2f.
  auto mlp = [&](double width) { return (m.gated ? 4.0 : 2.0) * width + gemm_input * width; };
  double mlp_bytes = mlp(static_cast<double>(m.ffn));
  if (m.moe()) {
    // Each routed copy keeps its permuted input (the experts' first linear input) and its
    // MLP's tensors; the busiest rank holds moe_imbalance times the mean. The routing
    // weight multiplies the activation's output before the down projection (Megatron-Core's
    // and MindSpeed's grouped MLP, activation_func_with_probs), so the combine is a plain
    // sum and keeps no expert output. A stack that recomputes the activation keeps only
    // its input, at the GEMMs' input precision.
    auto expert_mlp = [&](double width) {
      return sw.recompute_moe_activation ? (m.gated ? 2.0 : 1.0) * width * gemm_input : mlp(width);
    };
    const double routed = static_cast<double>(m.top_k) * sw.moe_imbalance *
                          (gemm_input * h + expert_mlp(static_cast<double>(m.expert_ffn)));
    const double shared =
        static_cast<double>(m.shared_experts) * expert_mlp(static_cast<double>(m.expert_ffn));
    const double dense_share = m.dense_share();
    mlp_bytes = dense_share * mlp_bytes + (1.0 - dense_share) * (routed + shared);
  }
  const double split = attention + mlp_bytes;
  return sw.sequence_parallel ? (whole + split) / t : whole + split / t;
}

// Memory outside the model's own tensors: the CUDA context and the communication
// libraries' buffers (about 0.5 and 1 GB on H100-class chips), and what the caching
// allocator loses to fragmentation. The runs known to have fit bound the latter: Llama 3
// 405B at its published layout needs 84.4 of the H100's 85.9 GB by this model, so more
// than about 2% would contradict a run that happened; 1% is used (docs/architecture.md).
constexpr double kRuntimeReserveGb = 1.5;
constexpr double kFragmentation = 0.01;

// One chip's compute rate: while communication kernels overlap compute they hold a share
// of its units.
double compute_share(const Software& sw) { return 1.0 - std::clamp(sw.comm_sm_fraction, 0.0, 0.9); }

}  // namespace

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::none;
  if (text == "selective") return Recompute::selective;
  if (text == "full") return Recompute::full;
  throw Error("recompute = '" + text + "', expected none, selective or full");
}

Precision parse_precision(const std::string& text) {
  if (text == "bf16") return Precision::bf16;
  if (text == "fp8") return Precision::fp8;
  throw Error("precision = '" + text + "', expected bf16 or fp8");
}

const char* precision_name(Precision p) { return p == Precision::fp8 ? "fp8" : "bf16"; }

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

double attention_core_flops(const Model& m, double tokens, double seq) {
  return 2.0 * tokens * seq * (m.qk_width() + m.v_width());
}

// The forward FLOPs of MLA's up-projections that a stack recomputing them runs again
// (none under full recomputation, which reruns the whole layer anyway).
static double mla_up_projection_flops(const Model& m, const Layout& l, const Software& sw,
                                      double tokens) {
  if (!m.mla() || !sw.recompute_mla_up_projection || l.recompute == Recompute::full)
    return 0.0;
  const double heads = static_cast<double>(m.heads);
  const double q = static_cast<double>(m.q_lora_rank) * m.qk_width();
  const double kv = static_cast<double>(m.kv_lora_rank) * heads *
                    static_cast<double>(m.qk_nope_dim + m.v_head_dim);
  return 2.0 * tokens * (q + kv);
}

double layer_forward_flops(const Model& m, double tokens, double seq) {
  double h = static_cast<double>(m.hidden);
  double proj = 2.0 * tokens * m.attention_params();
  double attn = attention_core_flops(m, tokens, seq);
  double dense_mlp = 2.0 * tokens * m.dense_mlp_params();
  if (!m.moe()) return proj + attn + dense_mlp;
  double moe_mlp = 2.0 * tokens * (static_cast<double>(m.top_k + m.shared_experts) * m.expert_params() +
                                   h * static_cast<double>(m.experts));  // + router
  const double dense_share = m.dense_share();
  return proj + attn + dense_share * dense_mlp + (1.0 - dense_share) * moe_mlp;
}

AllToAllBytes moe_dispatch_bytes(const Model& m, const Layout& l, std::int64_t domain, double bytes_per_element) {
  AllToAllBytes out;
  if (!m.moe() || l.ep <= 1) return out;
  const double h = static_cast<double>(m.hidden), k = static_cast<double>(m.top_k);
  const std::int64_t etp = expert_tp(l);
  const double group = static_cast<double>(etp * l.ep);
  const double per_node = static_cast<double>(std::min<std::int64_t>(domain, etp * l.ep));
  const double nodes = std::ceil(group / per_node);
  // Each token's hidden state goes to its k experts' ranks (its TP slice to each, but the
  // TP group sends the whole state once between them); a copy to the token's own rank
  // stays. Experts are spread evenly, so a copy lands on a given rank with chance 1/ep.
  const double ep = static_cast<double>(l.ep);
  // Per chip: tp-sliced hidden states (experts split over tp), or whole states of the
  // chip's 1/tp share of the tokens (folded): h / tp bytes per token of the micro-batch.
  const double row = h * bytes_per_element / static_cast<double>(l.tp);
  if (nodes <= 1.0) {
    out.scale_up = k * (ep - 1.0) / ep * row;
    return out;
  }
  if (m.route_nodes > 0) {
    // Node-limited routing (DeepSeek-V3 sec. 3.2.2): the k experts sit on at most
    // route_nodes nodes; the token crosses the fabric once per remote node among the ones
    // it reaches (expected distinct nodes of k draws over `nodes`, capped) and is fanned
    // out over the scale-up links inside each.
    const double distinct = std::min(static_cast<double>(m.route_nodes), nodes * (1.0 - std::pow(1.0 - 1.0 / nodes, k)));
    out.scale_out = distinct * (nodes - 1.0) / nodes * row;
    out.scale_up = k * (per_node - 1.0) / per_node * row;
  } else {
    // Every copy bound for another node crosses the fabric on its own.
    out.scale_out = k * (nodes - 1.0) / nodes * row;
    out.scale_up = k * (per_node - 1.0) / group * row;
  }
  return out;
}

std::vector<std::int64_t> stage_layers(const Model& m, const Layout& l) {
  const std::int64_t virtual_stages = l.pp * l.interleave;
  std::vector<std::int64_t> per_virtual = l.stages;
  if (per_virtual.empty()) {
    const std::int64_t base = m.layers / virtual_stages, longer = m.layers % virtual_stages;
    per_virtual.assign(static_cast<std::size_t>(virtual_stages), base + (longer > 0 ? 1 : 0));
    // virtual_stages - longer stages have one layer fewer: from both ends inwards.
    std::int64_t fewer = longer > 0 ? virtual_stages - longer : 0;
    for (std::int64_t k = 0; fewer > 0; ++k) {
      per_virtual[static_cast<std::size_t>(k)] -= 1;  // from the front
      --fewer;
      if (fewer > 0) {  // and from the back
        per_virtual[static_cast<std::size_t>(virtual_stages - 1 - k)] -= 1;
        --fewer;
      }
    }
  }
  std::vector<std::int64_t> per_rank(static_cast<std::size_t>(l.pp), 0);
  for (std::size_t k = 0; k < per_virtual.size(); ++k)
    per_rank[k % static_cast<std::size_t>(l.pp)] += per_virtual[k];
  return per_rank;
}

std::string check_layout(const Model& m, const Chip& chip, const Layout& l) {
  auto s = [](std::int64_t v) { return std::to_string(v); };
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.cp < 1 || l.ep < 1 || l.micro_batch < 1 || l.interleave < 1)
    return "every parallel degree and the micro-batch must be >= 1";
  // Key/value heads: split over tp, or each held by tp / kv_heads ranks (kv_copies).
  if (m.heads % l.tp != 0 || (m.kv_heads % l.tp != 0 && l.tp % m.kv_heads != 0))
    return "tp " + s(l.tp) + " does not divide the heads (" + s(m.heads) + " query, " + s(m.kv_heads) +
           " kv) nor is a multiple of the kv heads";
  if (m.ffn % l.tp != 0) return "tp " + s(l.tp) + " does not divide the ffn width " + s(m.ffn);
  if (l.interleave > 1 && l.pp == 1) return "interleaving needs pp > 1";
  // A virtual stage may hold the embedding or the loss alone (Megatron-Core's
  // account_for_embedding/loss_in_pipeline_split): at most layers + 2 of them.
  if (l.pp > m.layers || l.pp * l.interleave > m.layers + 2)
    return "pp " + s(l.pp) + (l.interleave > 1 ? " x interleave " + s(l.interleave) : "") + " is more stages than the " +
           s(m.layers) + " layers";
  if (!l.stages.empty()) {
    if (static_cast<std::int64_t>(l.stages.size()) != l.pp * l.interleave)
      return "stages lists " + s(static_cast<std::int64_t>(l.stages.size())) + " stages, expected pp x interleave = " +
             s(l.pp * l.interleave);
    std::int64_t sum = 0;
    for (std::int64_t n : l.stages) {
      if (n < 1 || n > m.layers) return "stages: a stage of " + s(n) + " layers, expected 1.." + s(m.layers);
      sum += n;
    }
    if (sum != m.layers) return "stages sum to " + s(sum) + " layers, the model has " + s(m.layers);
  }
  if (l.seq % l.cp != 0) return "cp " + s(l.cp) + " does not divide the sequence " + s(l.seq);
  if (m.moe()) {
    if (m.experts % l.ep != 0) return "ep " + s(l.ep) + " does not divide the " + s(m.experts) + " experts";
    // Experts shard across data parallel (each expert then split over tp), or, folded
    // (Megatron-Core's MoE parallel folding, expert tp 1), across tp x cp x dp.
    if (l.dp % l.ep != 0 && (l.tp * l.cp * l.dp) % l.ep != 0)
      return "ep " + s(l.ep) + " must divide dp " + s(l.dp) + " (experts shard across data parallel) or tp x cp x dp " +
             s(l.tp * l.cp * l.dp) + " (folded)";
  } else if (l.ep != 1) {
    return "ep " + s(l.ep) + " needs a mixture-of-experts model";
  }
  if (l.global_batch % (l.dp * l.micro_batch) != 0)
    return "global batch " + s(l.global_batch) + " is not a multiple of dp x micro-batch = " + s(l.dp * l.micro_batch);
  if (l.zero < 0 || l.zero > 3) return "zero stage " + std::to_string(l.zero) + " is not 0..3";
  (void)chip;
  return "";
}

Memory memory_per_chip(const Model& m, const Layout& l, const Software& sw, double hbm_gib) {
  // The pipeline rank that needs the most: each rank's weights, optimizer and activations.
  const std::vector<std::int64_t> stages = stage_layers(m, l);
  const double s = static_cast<double>(l.seq) / static_cast<double>(l.cp);
  const double b = static_cast<double>(l.micro_batch), h = static_cast<double>(m.hidden);
  const double t = static_cast<double>(l.tp), p = static_cast<double>(l.pp);
  const double per_layer = s * b * activation_bytes_per_token(m, l, sw);  // one micro-batch
  const ParamBytes dense_bytes = param_bytes(l.zero, dense_replicas(l));
  const ParamBytes expert_bytes = param_bytes(l.zero, expert_replicas(l));
  // Under 1F1B, rank i keeps pp - i micro-batches of its layers in flight (at most the
  // micro-batches there are). Interleaving keeps (1 + (pp - 1) / (pp v)) times as many on
  // the first rank (Korthikanti et al.); DualPipe pp + 1 on every rank, and two stages'
  // weights and gradients (the two directions; one optimizer state serves both copies).
  const double microbatches = static_cast<double>(l.global_batch) / static_cast<double>(l.dp * l.micro_batch);
  const bool dualpipe = sw.dualpipe && l.pp > 1;
  Memory most;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const double in_flight = dualpipe ? p + 1.0 : p - static_cast<double>(i);
    double act = per_layer * static_cast<double>(stages[i]) * in_flight;
    if (i == 0) act += (8.0 * s * b * p + s * b * h * p) / t;  // embedding input and its dropout
    if (l.pp > 1 && l.interleave > 1) act *= 1.0 + (p - 1.0) / (p * static_cast<double>(l.interleave));
    if (l.pp > 1 && l.interleave == 1 && !dualpipe) act *= std::min(1.0, microbatches / in_flight);
    if (i + 1 == stages.size())  // the output layer's input and its fp32 logits (Megatron's formula)
      act += s * b * h * 4.0 * (1.0 + static_cast<double>(m.vocab) / h) / t * static_cast<double>(1 + m.mtp_layers);
    const ChipParams params = params_per_chip(m, l, static_cast<double>(stages[i]), i == 0);
    auto held = [&](double ParamBytes::*part) {
      return params.dense * dense_bytes.*part + params.expert * expert_bytes.*part;
    };
    const double copies = dualpipe ? 2.0 : 1.0;
    Memory mem;
    mem.rank = static_cast<std::int64_t>(i);
    mem.weights_gb = copies * held(&ParamBytes::weights) / 1e9;
    mem.gradients_gb = copies * held(&ParamBytes::gradients) / 1e9;
    mem.optimizer_gb = held(&ParamBytes::optimizer) / 1e9;
    mem.weights_and_optimizer_gb = mem.weights_gb + mem.gradients_gb + mem.optimizer_gb;
    mem.activations_gb = act / 1e9;
    mem.reserve_gb = kRuntimeReserveGb + kFragmentation * (mem.weights_and_optimizer_gb + mem.activations_gb);
    mem.total_gb = mem.weights_and_optimizer_gb + mem.activations_gb + mem.reserve_gb;
    if (i == 0 || mem.total_gb > most.total_gb) most = mem;
  }
  // HBM sizes are binary: an "80 GB" H100 holds 80 GiB, 85.9e9 bytes.
  most.capacity_gb = hbm_gib * 1.073741824;
  return most;
}

std::string describe_memory(const Memory& m, const std::string& chip_id) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "needs %.1f GB per chip on pipeline rank %lld (weights %.1f, gradients %.1f, optimizer %.1f, "
                "activations %.1f, runtime and fragmentation %.1f); %s holds %.1f GB",
                m.total_gb, static_cast<long long>(m.rank), m.weights_gb, m.gradients_gb, m.optimizer_gb,
                m.activations_gb, m.reserve_gb, chip_id.c_str(), m.capacity_gb);
  return buf;
}

Estimate estimate(const Model& m, const Chip& chip, const Layout& l, const Software& sw) {
  Estimate e;
  if (std::string bad = check_layout(m, chip, l); !bad.empty()) {
    e.feasible = false;
    e.reason = bad;
    return e;
  }
  auto need = [&](const Figure& f, const char* name) {
    if (!f.known() && e.feasible) {
      e.feasible = false;
      e.reason = chip.id + ": " + name + " is " + (f.unsupported ? "unsupported" : "unknown") +
                 " (source: " + f.source + "); the model needs it";
    }
  };
  const Figure& peak_figure = l.precision == Precision::fp8 ? chip.fp8_tflops : chip.bf16_tflops;
  need(peak_figure, l.precision == Precision::fp8 ? "fp8_tflops" : "bf16_tflops");
  need(chip.hbm_gb, "hbm_gb");
  need(chip.hbm_tbps, "hbm_tbps");
  need(chip.scaleup_gbps, "scaleup_gbps");
  need(chip.scaleup_domain, "scaleup_domain");
  need(chip.scaleout_gbits, "scaleout_gbits");
  need(chip.gemm_efficiency, "gemm_efficiency");
  if (!e.feasible) return e;

  if (!sw.interleaved_schedule && l.interleave > 1) {
    e.feasible = false;
    e.reason = "interleave " + std::to_string(l.interleave) +
               ": the software stack has no interleaved pipeline schedule (plain 1F1B only)";
    return e;
  }
  if (sw.dualpipe && l.pp > 1 && (l.pp % 2 != 0 || l.interleave != 1)) {
    e.feasible = false;
    e.reason = "DualPipe needs an even pp and no interleaving (it splits each rank's layers into two chunks itself)";
    return e;
  }

  // GEMMs run at the precision's peak; MFU is reported against the same peak. The
  // attention core (Q K^T, softmax, the sum over V) stays in bf16 under fp8 training, as
  // Transformer Engine and DeepSeek-V3 (sec. 3.3.1) keep it; a chip without a bf16 figure
  // runs it at the fp8 rate.
  const double peak = *peak_figure.value * 1e12;
  const double attention_peak = chip.bf16_tflops.known() ? *chip.bf16_tflops.value * 1e12 : peak;
  const double hbm = *chip.hbm_tbps.value * 1e12 * kMemoryEfficiency;
  const Links links{*chip.scaleup_gbps.value * 1e9, *chip.scaleout_gbits.value / 8.0 * 1e9,
                    scaleup_domain_chips(chip)};
  const double h = static_cast<double>(m.hidden), seq = static_cast<double>(l.seq);
  const double t = static_cast<double>(l.tp), cp = static_cast<double>(l.cp);
  const double tokens_mb = static_cast<double>(l.micro_batch) * seq;  // per micro-batch, whole sequence
  const double tokens_chip = tokens_mb / cp;
  // Times below are per layer and micro-batch until the slowest pipeline rank is known
  // (its layers, and the output layer on the last); then per micro-batch on that rank.
  const std::vector<std::int64_t> stages = stage_layers(m, l);
  const double r = l.recompute == Recompute::full ? 1.0 : 0.0;
  const double dense_share = m.dense_share();

  // ---- compute per micro-batch on one stage --------------------------------------------
  auto gemm_eff = [&](double size) { return *chip.gemm_efficiency.value * size / (size + kGemmHalf); };
  double x = tokens_chip * h / t;
  double eff = gemm_eff(x);
  double attn_flops = attention_core_flops(m, tokens_mb, seq) / (t * cp);
  double gemm_flops = layer_forward_flops(m, tokens_mb, seq) / (t * cp) - attn_flops +
                      (kv_copies(m, l) - 1.0) * 2.0 * tokens_chip * m.kv_projection_params() / t;
  // Routed experts: each expert's GEMMs see only the rows routed to it. An expert group of
  // ep x expert-tp chips receives the tokens of ep x expert-tp / tp of them (tokens_chip
  // each per TP group), k copies of each spread over the experts, so one expert's GEMM has
  // tokens_chip x ep x expert-tp / tp x k / E rows on weights split expert-tp ways: its size
  // on the curve above is x x ep x k / E (Mixtral's 8 experts, top-2, ep 1: a quarter of
  // the dense GEMMs'). The busiest expert rank computes moe_imbalance times its share.
  double routed_flops = 0;
  double expert_eff = eff;
  if (m.moe()) {
    routed_flops = (1.0 - dense_share) * 2.0 * tokens_chip * static_cast<double>(m.top_k) * m.expert_params() / t;
    gemm_flops -= routed_flops;
    routed_flops *= sw.moe_imbalance;
    expert_eff = gemm_eff(x * static_cast<double>(l.ep * m.top_k) / static_cast<double>(m.experts));
  }
  // A flash kernel skips the score blocks above the causal diagonal (FlashAttention-2,
  // Dao 2023, sec. 3.1.1), so it computes half the s x s scores, at its own rate (the
  // chip's attention_efficiency of the GEMM rate). Materialised scores go through batched
  // GEMMs over the full s x s, at the GEMM rate, with the mask applied afterwards.
  const double attention_eff = chip.attention_efficiency.value.value_or(kFlashAttentionEfficiency);
  double t_attention = sw.flash_attention
                           ? 0.5 * attn_flops / (attention_peak * eff * attention_eff)
                           : attn_flops / (attention_peak * eff);
  double t_gemm = gemm_flops / (peak * eff) +
                  routed_flops / (peak * expert_eff * sw.moe_efficiency) + t_attention;
  double act_bytes = tokens_chip * h * kActivationPasses * 2.0 / (sw.sequence_parallel ? t : 1.0);
  double score_bytes = sw.flash_attention ? 0.0 : static_cast<double>(l.micro_batch) * (m.heads / t) * (seq / cp) * seq * kScorePasses * 2.0;
  // fp8 GEMMs read quantised copies of their inputs: each input element of the four GEMM
  // groups (QKV, output projection, MLP up and down) is read in bf16 and written in fp8,
  // once for the forward GEMM and once each for the two backward ones (3 x 3 bytes).
  double fp8_cast_bytes = 0;
  if (l.precision == Precision::fp8) {
    double mlp_width = dense_share * static_cast<double>(m.ffn) +
                       (1.0 - dense_share) * static_cast<double>(m.top_k + m.shared_experts) * static_cast<double>(m.expert_ffn);
    double routed_inputs = m.moe() ? (1.0 - dense_share) * static_cast<double>(m.top_k + m.shared_experts - 1) * h : 0.0;
    fp8_cast_bytes = tokens_chip * (h + m.v_width() + h + routed_inputs + mlp_width) / t * 9.0;
  }
  double t_mem = (act_bytes + score_bytes + fp8_cast_bytes) / hbm;
  double t_fwd = (t_gemm + t_mem) / compute_share(sw);
  double t_selective = l.recompute == Recompute::selective
                           ? (t_attention + score_bytes / hbm) / compute_share(sw)
                           : 0.0;
  // A stack that recomputes MLA's up-projections runs them again before the backward:
  // q_lora -> heads x (nope + rope) and kv_lora -> heads x (nope + v), at the GEMM rate.
  const double up_projection_flops = mla_up_projection_flops(m, l, sw, tokens_chip) / t;
  t_selective += up_projection_flops / (peak * eff) / compute_share(sw);
  double logits = 2.0 * tokens_chip * h * static_cast<double>(m.vocab) / t;
  double t_layer_compute = (3.0 + r) * t_fwd + t_selective;  // one layer
  double t_logits = 3.0 * logits / (peak * eff) / compute_share(sw);

  // ---- communication per micro-batch ----------------------------------------------------
  auto link = [&](std::int64_t group_span) {
    return group_span <= links.domain ? std::pair{links.up_bytes_s, kScaleUpLatency}
                                      : std::pair{links.out_bytes_s, kScaleOutLatency};
  };
  auto [tp_bw, tp_alpha] = link(l.tp);
  double tp_bytes = tokens_chip * h * 2.0;
  double t_tp = (4.0 + 2.0 * r) * ring_allreduce(tp_bytes, l.tp, tp_bw, tp_alpha);
  double t_cp = 0.0;
  if (l.cp > 1) {  // ring attention: K and V blocks travel around the cp ring, hidden under attention
    auto [cp_bw, cp_alpha] = link(l.tp * l.cp);
    double kv_bytes = 2.0 * tokens_chip * h * (static_cast<double>(m.kv_heads) / m.heads) / t * 2.0 * kv_copies(m, l);
    double comm = (3.0 + r) * (static_cast<double>(l.cp - 1) * (kv_bytes / (cp_bw * kLinkEfficiency) + cp_alpha));
    t_cp = std::max(0.0, comm - (3.0 + r) * t_attention);
  }
  double t_ep = 0.0;
  if (m.moe() && l.ep > 1) {
    // Per MoE layer: forward dispatch (fp8 under fp8 training, with one fp32 scale per 128
    // elements as DeepSeek-V3 sec. 3.3.2) and combine (bf16); backward the two reversed,
    // in bf16; full recomputation repeats the forward pair. Scale-up and scale-out links
    // carry their shares at once.
    const double moe_share = static_cast<double>(m.moe_layers()) / static_cast<double>(m.layers);
    const double dispatch_element = l.precision == Precision::fp8 ? 1.0 + 4.0 / 128.0 : 2.0;
    auto phase = [&](double element_bytes) {
      AllToAllBytes per_token = moe_dispatch_bytes(m, l, links.domain, element_bytes);
      double out = tokens_chip * per_token.scale_out / (links.out_bytes_s * kLinkEfficiency);
      double up = tokens_chip * per_token.scale_up / (links.up_bytes_s * kLinkEfficiency);
      return std::max(out, up) + (per_token.scale_out > 0 ? kScaleOutLatency : kScaleUpLatency);
    };
    const double bf16_phase = phase(2.0);
    double per_layer = (1.0 + r) * (phase(dispatch_element) + bf16_phase) + 2.0 * bf16_phase;
    // Overlapped: the all-to-all runs under another micro-batch's compute of the layer;
    // only what outlasts it waits.
    t_ep = moe_share * (sw.overlap_ep ? std::max(0.0, per_layer - t_layer_compute) : per_layer);
  }
  double t_pp = 0.0;
  if (l.pp > 1) {
    auto [pp_bw, pp_alpha] = link(l.tp * l.cp * l.pp);
    // Each TP rank sends its 1/tp slice (Megatron's scatter/gather optimisation, 2021).
    double bytes = tokens_chip * h * 2.0 / t;
    t_pp = static_cast<double>(l.interleave) * 2.0 * (bytes / (pp_bw * kLinkEfficiency) + pp_alpha);
  }
  // The last rank carries the output layer and the loss, and each multi-token-prediction
  // module (a layer and another output layer, DeepSeek-V3 sec. 2.2).
  const double mtp = static_cast<double>(m.mtp_layers);
  const double t_head = (1.0 + mtp) * t_logits + mtp * (t_layer_compute + t_tp + t_cp + t_ep);
  std::size_t slowest = 0;
  double slowest_s = -1;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const double rank_s = static_cast<double>(stages[i]) * (t_layer_compute + t_tp + t_cp + t_ep) +
                          (i + 1 == stages.size() ? t_head : 0.0);
    if (rank_s > slowest_s) {
      slowest_s = rank_s;
      slowest = i;
    }
  }
  const bool last = slowest + 1 == stages.size();
  const double n_layers = static_cast<double>(stages[slowest]) + (last ? mtp : 0.0);
  const double t_compute_mb = n_layers * t_layer_compute + (last ? (1.0 + mtp) * t_logits : 0.0);
  t_tp *= n_layers;
  t_cp *= n_layers;
  t_ep *= n_layers;
  t_fwd *= n_layers;
  double per_mb = t_compute_mb + t_tp + t_cp + t_ep + t_pp;

  // ---- the step -------------------------------------------------------------------------
  double microbatches = static_cast<double>(l.global_batch) / static_cast<double>(l.dp * l.micro_batch);
  double bubble = static_cast<double>(l.pp - 1) / static_cast<double>(l.interleave) * per_mb;
  if (sw.dualpipe && l.pp > 1) {
    // DualPipe (DeepSeek-V3 Table 2): (pp/2 - 1)(F&B + B - 3W), with a micro-batch's
    // forward F, full backward B = 2F (+ F recomputed), weight-gradient part W = F and an
    // overlapped forward-and-backward pair F&B = F + B.
    const double f = per_mb / (3.0 + r);
    bubble = std::max(0.0, static_cast<double>(l.pp) / 2.0 - 1.0) * (2.0 + 2.0 * r) * f;
  }
  Memory mem = memory_per_chip(m, l, sw, *chip.hbm_gb.value);
  const ChipParams params_chip = max_params_per_chip(m, l, stages);
  auto [dp_bw, dp_alpha] = link(l.chips());
  // ZeRO-3 gathers weights for forward and backward: 1.5x an all-reduce's volume.
  double volume = l.zero >= 3 ? 1.5 : 1.0;
  // Dense gradients are reduced over dp x cp, an expert shard's over its expert-data-parallel
  // group (the two run one after the other).
  double t_dp = volume * (ring_allreduce(params_chip.dense * 2.0, dense_replicas(l), dp_bw, dp_alpha) +
                          ring_allreduce(params_chip.expert * 2.0, expert_replicas(l), dp_bw, dp_alpha));
  double backward_total = microbatches * 2.0 * t_fwd;
  double dp_exposed = t_dp;
  if (sw.overlap_dp) {
    // Overlapped reduction runs bucket by bucket as the backward pass completes each
    // bucket's gradients; Megatron-Core's buckets hold max(40M, 1M x dp x cp) parameters
    // (distributed_data_parallel.py: larger groups get larger buckets so the ring stays
    // bandwidth-bound). The last bucket can start only when the backward pass ends, and
    // the first bucket's parameter all-gather gates the next forward, so one bucket's
    // all-reduce stays exposed however much backward there is to hide under.
    const double replicas = static_cast<double>(dense_replicas(l));
    const double bucket = std::min(params_chip.dense, std::max(40e6, 1e6 * replicas));
    const double last_bucket =
        volume * ring_allreduce(bucket * 2.0, dense_replicas(l), dp_bw, dp_alpha);
    dp_exposed = std::max(last_bucket, t_dp - backward_total);
  }
  double t_optimizer = (params_chip.dense * param_bytes(l.zero, dense_replicas(l)).total() +
                        params_chip.expert * param_bytes(l.zero, expert_replicas(l)).total()) *
                       2.0 / hbm;  // read + write states

  e.compute_s = microbatches * t_compute_mb + t_optimizer;
  e.exposed_comm_s = microbatches * (t_tp + t_cp + t_ep + t_pp) + dp_exposed;
  e.bubble_s = bubble;
  e.step_time_s = e.compute_s + e.exposed_comm_s + e.bubble_s;

  double tokens_step = static_cast<double>(l.global_batch) * seq;
  double layer_fwd = layer_forward_flops(m, tokens_step, seq) * static_cast<double>(m.layers);
  double logits_fwd = 2.0 * tokens_step * h * static_cast<double>(m.vocab);
  e.model_flops = 3.0 * (layer_fwd + logits_fwd);
  if (m.mtp_layers > 0)  // each prediction module: one more layer and output layer per token
    e.model_flops += 3.0 * mtp * (layer_forward_flops(m, tokens_step, seq) + logits_fwd);
  double recompute_flops =
      l.recompute == Recompute::full
          ? layer_fwd
          : (l.recompute == Recompute::selective
                 ? attention_core_flops(m, tokens_step, seq) * static_cast<double>(m.layers)
                 : 0.0);
  if (l.recompute != Recompute::full)
    recompute_flops +=
        mla_up_projection_flops(m, l, sw, tokens_step) * static_cast<double>(m.layers);
  e.hardware_flops = e.model_flops + recompute_flops;
  double chips = static_cast<double>(l.chips());
  e.tflops_per_chip = e.model_flops / e.step_time_s / chips / 1e12;
  e.hw_tflops_per_chip = e.hardware_flops / e.step_time_s / chips / 1e12;
  e.mfu = e.model_flops / e.step_time_s / chips / peak;
  e.tokens_per_s = tokens_step / e.step_time_s;
  e.memory = mem;
  if (mem.total_gb > mem.capacity_gb) {
    e.feasible = false;
    e.reason = describe_memory(mem, chip.id);
  }
  return e;
}

bool has_estimates(const Chip& chip) {
  for (const Figure* f :
       {&chip.bf16_tflops, &chip.fp8_tflops, &chip.hbm_tbps, &chip.scaleup_gbps,
        &chip.scaleout_gbits, &chip.tdp_w, &chip.gemm_efficiency, &chip.attention_efficiency})
    if (f->ranged()) return true;
  return false;
}

Chip chip_at_bounds(const Chip& chip, bool optimistic) {
  Chip out = chip;
  auto at = [&](Figure& f, bool high) {
    if (f.ranged()) f.value = high ? f.high : f.low;
  };
  for (Figure* f : {&out.bf16_tflops, &out.fp8_tflops, &out.hbm_tbps, &out.scaleup_gbps,
                    &out.scaleout_gbits, &out.gemm_efficiency, &out.attention_efficiency})
    at(*f, optimistic);
  at(out.tdp_w, !optimistic);  // the fast end draws the least power
  return out;
}

Totals totals(const Estimate& e, const Chip& chip, const Layout& l, double tokens, double price_override) {
  Totals t;
  double tokens_step = static_cast<double>(l.global_batch) * static_cast<double>(l.seq);
  t.steps = tokens / tokens_step;
  double seconds = t.steps * e.step_time_s;
  t.days = seconds / 86400.0;
  t.chip_hours = static_cast<double>(l.chips()) * seconds / 3600.0;
  t.energy_known = chip.tdp_w.known();
  t.energy_kwh = t.energy_known ? t.chip_hours * *chip.tdp_w.value / 1000.0 : 0.0;  // chips at TDP, no PUE
  double price = price_override >= 0 ? price_override : (chip.price_per_hour.known() ? *chip.price_per_hour.value : -1);
  t.cost_known = price >= 0;
  t.cost_usd = t.cost_known ? t.chip_hours * price : 0.0;
  return t;
}

}  // namespace loom::cluster
