#include "dist/mpi_communicator.h"

#ifdef LOOM_HAVE_MPI
#include <mpi.h>

#include <climits>
#include <cstdlib>

#include "core/error.h"
#endif

namespace loom::dist {

#ifdef LOOM_HAVE_MPI
namespace {

void ok(int status, const char* what) {
  if (status == MPI_SUCCESS)
    return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(status, text, &length);
  throw Error(std::string("mpi: ") + what + " failed: " + text);
}

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      ok(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
          MPI_Finalize();
      });
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors become loom::Error
    ok(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    ok(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(std::span<float> data) override {
    // MPI counts are int: large buffers go in pieces.
    for (std::size_t at = 0; at < data.size(); at += INT_MAX) {
      int count = static_cast<int>(std::min<std::size_t>(INT_MAX, data.size() - at));
      ok(MPI_Allreduce(MPI_IN_PLACE, data.data() + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
         "MPI_Allreduce");
    }
  }
  void send(std::span<const float> data, int dest) override {
    for (std::size_t at = 0; at < data.size(); at += INT_MAX) {
      int count = static_cast<int>(std::min<std::size_t>(INT_MAX, data.size() - at));
      ok(MPI_Send(data.data() + at, count, MPI_FLOAT, dest, 0, MPI_COMM_WORLD), "MPI_Send");
    }
  }
  void receive(std::span<float> data, int source) override {
    for (std::size_t at = 0; at < data.size(); at += INT_MAX) {
      int count = static_cast<int>(std::min<std::size_t>(INT_MAX, data.size() - at));
      ok(MPI_Recv(data.data() + at, count, MPI_FLOAT, source, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
         "MPI_Recv");
    }
  }
  void broadcast(std::span<std::byte> data, int root) override {
    for (std::size_t at = 0; at < data.size(); at += INT_MAX) {
      int count = static_cast<int>(std::min<std::size_t>(INT_MAX, data.size() - at));
      ok(MPI_Bcast(data.data() + at, count, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> mpi_world() {
  return std::make_unique<MpiWorld>();
}
#else
std::unique_ptr<Communicator> mpi_world() {
  return nullptr;
}
#endif

}  // namespace loom::dist
