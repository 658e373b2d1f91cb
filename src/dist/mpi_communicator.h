// dist/mpi_communicator.h — MPI's world communicator (built when CMake finds MPI).
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace loom::dist {

// Initialises MPI (thread level "funneled": only the main thread calls it) and returns
// the world communicator; finalised at exit. nullptr in a build without MPI.
std::unique_ptr<Communicator> mpi_world();

}  // namespace loom::dist
