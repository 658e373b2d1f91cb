// dist/mpi_communicator.h — MPI's world communicator (built when CMake finds MPI).
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace loom::dist {

// Initialises MPI (thread level "funneled": only the main thread calls it) and returns
// the world communicator; finalised at exit. nullptr in a build without MPI.
std::unique_ptr<Communicator> mpi_world();

// A process of a job of several MPI processes that fails ends the whole job (MPI_Abort with
// `exit_code`): its peers may be waiting for it in a collective, and MPI_Finalize at exit
// would wait for them in turn. Nothing when MPI is not running or the job is one process.
void abort_job_after_failure(int exit_code);

}  // namespace loom::dist
