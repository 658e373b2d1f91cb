// cluster/catalog — chips and models for the planner, loaded from YAML (catalog/).
// This column never touches tensors: it shares only core's error type with the engine.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::cluster {

// A published figure: its value (absent when `unknown`), whether the chip lacks the
// feature altogether, where it comes from and how sure that is.
// An estimated figure also carries the bounds its sources allow (low <= value <= high).
struct Figure {
  std::optional<double> value;
  std::optional<double> low, high;  // an estimate's stated bounds; absent for published figures
  bool unsupported = false;
  std::string source, confidence;
  bool known() const { return value.has_value(); }
  bool ranged() const { return low.has_value() && high.has_value(); }
};

struct Chip {
  std::string id, name, status;  // status: shipping | roadmap
  Figure bf16_tflops, fp8_tflops, fp4_tflops, hbm_gb, hbm_tbps, scaleup_gbps, scaleup_domain,
      scaleout_gbits, tdp_w, price_per_hour, gemm_efficiency;
  // The rate of a fused (flash) attention kernel, forward and backward, as a fraction of
  // the rate GEMMs of the same work reach on the chip (gemm_efficiency and the size
  // curve): softmax, masking and the kernel's tiling cost what plain GEMMs do not. A
  // chip's entry may calibrate it; absent, it is kFlashAttentionEfficiency (assumed).
  Figure attention_efficiency;
};

// The assumed flash-attention rate relative to GEMMs, for chips without a calibrated one:
// 0.5, at which a causal kernel (half the s x s scores) costs what the full scores at the
// GEMM rate would: the charge Loom's model made before it had a calibrated figure. The
// H100's, fitted on NeMo's 4K-1M token sweep, is 0.475 (bench/RESULTS.md).
inline constexpr double kFlashAttentionEfficiency = 0.5;

// A chip in a system: its scale-up domain and scale-out fabric override the chip's.
struct System {
  std::string id, name, chip;
  Figure scaleup_domain, scaleout_gbits;
};

struct Model {
  std::string id, source;
  std::int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 2048;
  bool gated = false;    // SwiGLU MLP: three matrices instead of two
  bool dropout = false;  // dropout after attention and MLP (GPT-3, Megatron 2021; not Llama): masks
                         // kept for backward
  std::int64_t experts = 0, top_k = 0, shared_experts = 0, expert_ffn = 0, dense_layers = 0;  // MoE
  // Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through
  // low-rank latents; 0 for kv_lora_rank means ordinary multi-head (or grouped) attention.
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  std::int64_t head_dim =
      0;  // per attention head; 0: hidden / heads (Qwen3: 128 with hidden 4096, 64 heads)
  std::int64_t route_nodes =
      0;  // node-limited routing: a token reaches experts on at most this many nodes (0: any)
  std::int64_t mtp_layers =
      0;  // multi-token prediction modules (DeepSeek-V3: 1), each a layer + an output head

  bool moe() const { return experts > 0; }
  bool mla() const { return kv_lora_rank > 0; }
  std::int64_t head_width() const { return head_dim > 0 ? head_dim : hidden / heads; }
  std::int64_t moe_layers() const { return moe() ? layers - dense_layers : 0; }
  // The share of layers with a dense MLP (1 for a dense model).
  double dense_share() const {
    return moe() ? static_cast<double>(dense_layers) / static_cast<double>(layers) : 1.0;
  }
  double attention_params()
      const;  // per layer: q, k, v, o projections (MLA: its down and up projections)
  // Per layer: the k and v projections alone (grouped attention; 0 under MLA, whose
  // latents are not split by key/value head).
  double kv_projection_params() const;
  // Per token and layer: the widths of the attention core's operands, in elements:
  // query/key width (heads x head dim; MLA: heads x (nope + rope)) and value width.
  double qk_width() const;
  double v_width() const;
  double dense_mlp_params() const;
  double expert_params() const;  // one expert
  double total_params() const;   // every weight, embedding included once (tied head)
  double active_params() const;  // weights a token passes through
  void validate(const std::string& where) const;
};

// A model's shape from a YAML mapping (a models.yaml entry, or a published run that gives
// its model inline); id and source are left to the caller. Throws naming `where` and the field.
Model model_from_yaml(const YAML::Node& entry, const std::string& where);
// The fields model_from_yaml reads, for readers that reject fields they do not know.
const std::set<std::string>& model_field_names();

// Throws "<where>: field 'x' is not a field of <what>" for the first field of the mapping
// `entry` that is in neither `known` nor `also`: a misspelt field would otherwise be
// ignored without a word and its default used. A key that is not a single value (a list
// used as a key) is named as such.
void check_known_fields(const YAML::Node& entry, const std::set<std::string>& known,
                        const std::string& where, const std::string& what,
                        const std::set<std::string>& also = {});

class Catalog {
 public:
  // Reads DIR/chips.yaml and DIR/models.yaml; throws naming file, entry, field, value.
  static Catalog load(const std::string& dir);
  const Chip& chip(const std::string& id) const;  // throws listing the known ids
  const Model& model(const std::string& id) const;
  // The chip of system `id` with the system's domain and fabric figures.
  Chip chip_in_system(const std::string& id) const;
  const std::vector<System>& systems() const { return systems_; }
  const std::vector<Chip>& chips() const { return chips_; }
  const std::vector<Model>& models() const { return models_; }
  void add_models_from(const std::string& path);  // a user's models.yaml

 private:
  std::vector<Chip> chips_;
  std::vector<Model> models_;
  std::vector<System> systems_;
};

// Applies a Loom device profile (docs/device-profile.md) to `chip`: the measured GEMM
// rate at `dtype` ("bf16" or "fp8") sets gemm_efficiency, the measured bandwidth the HBM
// figure. Throws naming the file, field and value.
void apply_device_profile(Chip& chip, const std::string& path, const std::string& dtype);

// The chip's scale-up domain as a chip count; throws naming the chip when the figure is
// unknown or not a whole number in 1..2^20.
std::int64_t scaleup_domain_chips(const Chip& chip);

// Default catalog folder: $LOOM_CATALOG, else <repo>/catalog next to the binary's tree.
std::string default_catalog_dir();

// A YAML file's root; throws naming the file: "cannot open", or "malformed YAML at line N".
YAML::Node read_yaml_file(const std::string& path);

// Runs `read`, which walks a YAML document read from `path`: a yaml-cpp exception on the
// way (a field of the wrong kind: a subscript of a scalar, a failed conversion) becomes a
// loom::Error naming the file, the line and column, and what yaml-cpp found, instead of
// escaping as an internal error.
template <class Read>
auto with_yaml_errors(const std::string& path, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const YAML::Exception& e) {
    throw Error(path + ": line " + std::to_string(e.mark.line + 1) + ", column " +
                std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

}  // namespace loom::cluster
