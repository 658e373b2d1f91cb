// dist/local_group.h — the ranks of a group as threads of one process, over shared memory.
// Tests check parallel layouts with it in one process, under the sanitizers and without a
// launcher; MPI runs the same code across processes. Collectives sum in rank order, so a
// result is the same for any interleaving of the threads (and for any group size: a
// deterministic reference for MPI's, whose association may vary with message size).
// A rank that does not arrive at a collective, or a message that does not come, within the
// timeout makes the waiting ranks fail with an error naming the collective; the group is then
// broken and every later call on it fails at once (no hang).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace loom::dist {

// `size` communicators of one group: element r is rank r, to be used by one thread at a time.
std::vector<std::unique_ptr<Communicator>> local_group(
    int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace loom::dist
