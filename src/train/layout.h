// train/layout.h — `loom train --layout FILE` (or - for standard input): the parallel layout a
// line of `loom plan --json` describes, applied to a run's settings (core/planned_layout.h).
#pragma once

#include "dist/communicator.h"
#include "train/config.h"

namespace loom::train {

// Reads cfg.layout (a file, or "-": rank 0 of `world` reads standard input and every rank
// gets its bytes) and sets tp, pipeline, stages, micro_batches, batch, context and zero from
// it, as if given on the command line. Refused by name, before any training: a layout
// `loom train` does not run (contract::engine_refusal), one whose processes are not the
// job's, and a key the run also sets to another value. Call before finalize().
void apply_layout(TrainConfig& cfg, dist::Communicator& world);

}  // namespace loom::train
