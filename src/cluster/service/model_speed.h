// cluster/service/model_speed — the performance model (cluster/perf) as the fleet service's
// speed source for transformer jobs on pools that stand for a catalog chip (pools.yaml's
// `chip`): one job process on one chip, no parallelism.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cluster/catalog/catalog.h"

namespace loom::service {

// Host time to launch one op on an accelerator, as the floor of a step: a step of N device
// op calls takes at least N x this long however small its GEMMs are. A few microseconds
// is the usual CUDA figure; Loom has not measured it on a GPU (assumed).
inline constexpr double kOpLaunchSeconds = 5e-6;

struct ModelSpeed {
  std::optional<double> step_s;  // predicted seconds per step; nullopt: the model does not apply
  std::string basis;             // "performance model of h100-sxm", or why it does not apply
};

// Seconds per training step of the transformer `described` (`loom ops --json`'s
// "transformer" object: layers, hidden, heads, ffn, vocab, seq, batch, precision) on `chip`:
// the larger of the performance model's step time (bf16 GEMMs at the chip's calibrated
// efficiency, attention scores materialised as Loom does, no recomputation, optimizer
// unsharded) and `launches` x kOpLaunchSeconds. Applies to bf16 products only: the catalog
// has no f32 rates.
ModelSpeed model_step_time(const nlohmann::json& described, std::uint64_t launches,
                           const cluster::Chip& chip);

}  // namespace loom::service
