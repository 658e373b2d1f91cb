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

double param_bytes_factor(int zero, std::int64_t dp) {
  // bf16 weights (2) + fp32 gradients (4) + fp32 master weights and Adam moments (12),
  // as Megatron's theoretical memory formula; ZeRO shards them across data parallel.
  double d = static_cast<double>(dp);
  switch (zero) {
    case 0: return 18.0;
    case 1: return 6.0 + 12.0 / d;
    case 2: return 2.0 + 16.0 / d;
    default: return 18.0 / d;
  }
}

// Weights held by one chip of a pipeline stage of `layers` layers (experts split over ep),
// plus the embedding on the first stage, all split over tp.
double params_per_chip(const Model& m, const Layout& l, double layers, bool first) {
  double dense_share = m.moe() ? static_cast<double>(m.dense_layers) / static_cast<double>(m.layers) : 1.0;
  double per_layer = m.attention_params() + dense_share * m.dense_mlp_params() +
                     (1.0 - dense_share) * static_cast<double>(m.experts + m.shared_experts) * m.expert_params() /
                         static_cast<double>(l.ep);
  double embedding = first ? static_cast<double>(m.vocab) * static_cast<double>(m.hidden) : 0.0;
  return (layers * per_layer + embedding) / static_cast<double>(l.tp);
}

// The most weights any pipeline rank holds (its gradients are what data parallel reduces).
double max_params_per_chip(const Model& m, const Layout& l, const std::vector<std::int64_t>& stages) {
  double most = 0;
  for (std::size_t i = 0; i < stages.size(); ++i)
    most = std::max(most, params_per_chip(m, l, static_cast<double>(stages[i]), i == 0));
  return most;
}

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

double layer_forward_flops(const Model& m, double tokens, double seq) {
  double h = static_cast<double>(m.hidden);
  double proj = 2.0 * tokens * m.attention_params();
  double attn = 4.0 * tokens * seq * h;
  double dense_mlp = 2.0 * tokens * m.dense_mlp_params();
  if (!m.moe()) return proj + attn + dense_mlp;
  double moe_mlp = 2.0 * tokens * (static_cast<double>(m.top_k + m.shared_experts) * m.expert_params() +
                                   h * static_cast<double>(m.experts));  // + router
  double dense_share = static_cast<double>(m.dense_layers) / static_cast<double>(m.layers);
  return proj + attn + dense_share * dense_mlp + (1.0 - dense_share) * moe_mlp;
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
  if (m.heads % l.tp != 0 || m.kv_heads % l.tp != 0)
    return "tp " + s(l.tp) + " does not divide the heads (" + s(m.heads) + " query, " + s(m.kv_heads) + " kv)";
  if (m.ffn % l.tp != 0) return "tp " + s(l.tp) + " does not divide the ffn width " + s(m.ffn);
  if (l.interleave > 1 && l.pp == 1) return "interleaving needs pp > 1";
  if (l.pp > m.layers || l.interleave > m.layers / l.pp)
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
    if (l.dp % l.ep != 0) return "ep " + s(l.ep) + " must divide dp " + s(l.dp) + " (experts shard across data parallel)";
  } else if (l.ep != 1) {
    return "ep " + s(l.ep) + " needs a mixture-of-experts model";
  }
  if (l.global_batch % (l.dp * l.micro_batch) != 0)
    return "global batch " + s(l.global_batch) + " is not a multiple of dp x micro-batch = " + s(l.dp * l.micro_batch);
  if (l.zero < 0 || l.zero > 3) return "zero stage " + std::to_string(l.zero) + " is not 0..3";
  (void)chip;
  return "";
}

Memory memory_per_chip(const Model& m, const Layout& l, const Software& sw) {
  // The pipeline rank that needs the most: each rank's weights, optimizer and activations.
  const std::vector<std::int64_t> stages = stage_layers(m, l);
  // Activations of the first pipeline stage, following Megatron-LM's
  // theoretical_memory_usage.py (Korthikanti et al. 2022, Table 2), bytes. Per layer and
  // micro-batch with sequence parallelism and selective recompute: s b h (18 + 4 f / h) / t,
  // with f the MLP width a token passes through (k experts for MoE layers; x1.5 for SwiGLU's
  // extra matrix). Without sequence parallelism 10 s b h of it is not split across t;
  // materialised attention scores add 5 a s / h; full recompute keeps only the layer input.
  const double s = static_cast<double>(l.seq) / static_cast<double>(l.cp);
  const double b = static_cast<double>(l.micro_batch), h = static_cast<double>(m.hidden);
  const double t = static_cast<double>(l.tp), p = static_cast<double>(l.pp);
  double dense_share = m.moe() ? static_cast<double>(m.dense_layers) / static_cast<double>(m.layers) : 1.0;
  double mlp_width = dense_share * static_cast<double>(m.ffn) +
                     (1.0 - dense_share) * static_cast<double>(m.top_k + m.shared_experts) * static_cast<double>(m.expert_ffn);
  if (m.gated) mlp_width *= 1.5;
  double shardable = 18.0 + 4.0 * mlp_width / h;
  double linear_part = sw.sequence_parallel ? shardable / t : 10.0 + (shardable - 10.0) / t;
  double score_part = sw.flash_attention ? 0.0 : 5.0 * static_cast<double>(m.heads) * static_cast<double>(l.seq) / (h * t);
  double per_layer = 0;
  switch (l.recompute) {
    case Recompute::none: per_layer = s * b * h * (linear_part + score_part); break;
    case Recompute::selective: per_layer = s * b * h * linear_part; break;
    case Recompute::full: per_layer = 2.0 * s * b * h / (sw.sequence_parallel ? t : 1.0); break;
  }
  // Under 1F1B, rank i keeps pp - i micro-batches of its layers in flight (at most the
  // micro-batches there are); the first also the embedding's input and its dropout.
  // Interleaving keeps (1 + (pp - 1) / (pp v)) times as many (Korthikanti et al.).
  double microbatches = static_cast<double>(l.global_batch) / static_cast<double>(l.dp * l.micro_batch);
  Memory most;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const double in_flight = p - static_cast<double>(i);
    double act = per_layer * static_cast<double>(stages[i]) * in_flight;
    if (i == 0) act += (8.0 * s * b * p + s * b * h * p) / t;  // embedding input and its dropout
    if (l.pp > 1 && l.interleave > 1) act *= 1.0 + (p - 1.0) / (p * static_cast<double>(l.interleave));
    if (l.pp > 1 && l.interleave == 1) act *= std::min(1.0, microbatches / in_flight);
    if (l.pp == 1) act += s * b * h * 4.0 * (1.0 + static_cast<double>(m.vocab) / h) / t;  // output layer and loss
    Memory mem;
    mem.weights_and_optimizer_gb =
        params_per_chip(m, l, static_cast<double>(stages[i]), i == 0) * param_bytes_factor(l.zero, l.dp) / 1e9;
    mem.activations_gb = act / 1e9;
    mem.total_gb = mem.weights_and_optimizer_gb + mem.activations_gb;
    if (i == 0 || mem.total_gb > most.total_gb) most = mem;
  }
  return most;
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

  // GEMMs run at the precision's peak; MFU is reported against the same peak.
  const double peak = *peak_figure.value * 1e12;
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

  // ---- compute per micro-batch on one stage --------------------------------------------
  double x = tokens_chip * h / t;
  double eff = *chip.gemm_efficiency.value * x / (x + kGemmHalf);
  double fwd_flops = layer_forward_flops(m, tokens_mb, seq) / (t * cp);
  double attn_flops = 4.0 * tokens_mb * seq * h / (t * cp);
  double t_gemm = fwd_flops / (peak * eff);
  double act_bytes = tokens_chip * h * kActivationPasses * 2.0 / (sw.sequence_parallel ? t : 1.0);
  double score_bytes = sw.flash_attention ? 0.0 : static_cast<double>(l.micro_batch) * (m.heads / t) * (seq / cp) * seq * kScorePasses * 2.0;
  double t_mem = (act_bytes + score_bytes) / hbm;
  double t_fwd = t_gemm + t_mem;
  double t_selective = l.recompute == Recompute::selective
                           ? attn_flops / (peak * eff) + score_bytes / hbm
                           : 0.0;
  double logits = 2.0 * tokens_chip * h * static_cast<double>(m.vocab) / t;
  double t_layer_compute = (3.0 + r) * t_fwd + t_selective;  // one layer
  double t_logits = 3.0 * logits / (peak * eff);

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
    double kv_bytes = 2.0 * tokens_chip * h * (static_cast<double>(m.kv_heads) / m.heads) / t * 2.0;
    double comm = (3.0 + r) * (static_cast<double>(l.cp - 1) * (kv_bytes / (cp_bw * kLinkEfficiency) + cp_alpha));
    t_cp = std::max(0.0, comm - (3.0 + r) * attn_flops / (peak * eff));
  }
  double t_ep = 0.0;
  if (m.moe() && l.ep > 1) {  // dispatch and combine all-to-alls, forward and backward
    auto [ep_bw, ep_alpha] = link(l.tp * l.ep);
    double moe_share = static_cast<double>(m.moe_layers()) / static_cast<double>(m.layers);
    double bytes = tokens_chip * h * static_cast<double>(m.top_k) * 2.0 * static_cast<double>(l.ep - 1) / static_cast<double>(l.ep);
    t_ep = moe_share * 2.0 * (2.0 + r) * (bytes / (ep_bw * kLinkEfficiency) + ep_alpha);
  }
  double t_pp = 0.0;
  if (l.pp > 1) {
    auto [pp_bw, pp_alpha] = link(l.tp * l.cp * l.pp);
    // Each TP rank sends its 1/tp slice (Megatron's scatter/gather optimisation, 2021).
    double bytes = tokens_chip * h * 2.0 / t;
    t_pp = static_cast<double>(l.interleave) * 2.0 * (bytes / (pp_bw * kLinkEfficiency) + pp_alpha);
  }
  // The slowest rank: the last carries the output layer and the loss too.
  std::size_t slowest = 0;
  double slowest_s = -1;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const double rank_s = static_cast<double>(stages[i]) * (t_layer_compute + t_tp + t_cp + t_ep) +
                          (i + 1 == stages.size() ? t_logits : 0.0);
    if (rank_s > slowest_s) {
      slowest_s = rank_s;
      slowest = i;
    }
  }
  const double n_layers = static_cast<double>(stages[slowest]);
  const double t_compute_mb =
      n_layers * t_layer_compute + (slowest + 1 == stages.size() ? t_logits : 0.0);
  t_tp *= n_layers;
  t_cp *= n_layers;
  t_ep *= n_layers;
  t_fwd *= n_layers;
  double per_mb = t_compute_mb + t_tp + t_cp + t_ep + t_pp;

  // ---- the step -------------------------------------------------------------------------
  double microbatches = static_cast<double>(l.global_batch) / static_cast<double>(l.dp * l.micro_batch);
  double bubble = static_cast<double>(l.pp - 1) / static_cast<double>(l.interleave) * per_mb;
  Memory mem = memory_per_chip(m, l, sw);
  double params_chip = max_params_per_chip(m, l, stages);
  auto [dp_bw, dp_alpha] = link(l.chips());
  // ZeRO-3 gathers weights for forward and backward: 1.5x an all-reduce's volume.
  double volume = l.zero >= 3 ? 1.5 : 1.0;
  double t_dp = volume * ring_allreduce(params_chip * 2.0, l.dp * l.cp, dp_bw, dp_alpha);
  double backward_total = microbatches * 2.0 * t_fwd;
  double dp_exposed = sw.overlap_dp ? std::max(0.0, t_dp - backward_total) : t_dp;
  double t_optimizer = params_chip * param_bytes_factor(l.zero, l.dp) * 2.0 / hbm;  // read + write states

  e.compute_s = microbatches * t_compute_mb + t_optimizer;
  e.exposed_comm_s = microbatches * (t_tp + t_cp + t_ep + t_pp) + dp_exposed;
  e.bubble_s = bubble;
  e.step_time_s = e.compute_s + e.exposed_comm_s + e.bubble_s;

  double tokens_step = static_cast<double>(l.global_batch) * seq;
  double layer_fwd = layer_forward_flops(m, tokens_step, seq) * static_cast<double>(m.layers);
  double logits_fwd = 2.0 * tokens_step * h * static_cast<double>(m.vocab);
  e.model_flops = 3.0 * (layer_fwd + logits_fwd);
  double recompute_flops = l.recompute == Recompute::full
                               ? layer_fwd
                               : (l.recompute == Recompute::selective ? 4.0 * tokens_step * seq * h * static_cast<double>(m.layers) : 0.0);
  e.hardware_flops = e.model_flops + recompute_flops;
  double chips = static_cast<double>(l.chips());
  e.tflops_per_chip = e.model_flops / e.step_time_s / chips / 1e12;
  e.hw_tflops_per_chip = e.hardware_flops / e.step_time_s / chips / 1e12;
  e.mfu = e.model_flops / e.step_time_s / chips / peak;
  e.tokens_per_s = tokens_step / e.step_time_s;
  e.memory = mem;
  if (mem.total_gb > *chip.hbm_gb.value) {
    e.feasible = false;
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs %.1f GB per chip (%.1f weights and optimizer, %.1f activations), %s has %.0f GB",
                  mem.total_gb, mem.weights_and_optimizer_gb, mem.activations_gb, chip.id.c_str(), *chip.hbm_gb.value);
    e.reason = buf;
  }
  return e;
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
