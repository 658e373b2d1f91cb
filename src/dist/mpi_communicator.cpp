#include "dist/mpi_communicator.h"

#ifdef LOOM_HAVE_MPI
#include <mpi.h>

#include <chrono>
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

// Records a collective's kind, bytes and wall time when it ends (communicator.h).
class Timed {
 public:
  Timed(CollectiveKind kind, std::size_t bytes)
      : kind_(kind), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    record_collective(
        kind_, bytes_,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  CollectiveKind kind_;
  std::size_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

// MPI counts are int: larger buffers go in pieces, f(first element, count) for each.
template <class F>
void in_pieces(std::size_t size, F f) {
  for (std::size_t at = 0; at < size; at += INT_MAX)
    f(at, static_cast<int>(std::min<std::size_t>(INT_MAX, size - at)));
}

void initialize_once() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized)
    return;
  int provided = 0;
  // SERIALIZED: the communication thread of overlapped gradient averaging calls MPI while
  // the main thread computes; the two never call it at the same time.
  ok(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  check(provided >= MPI_THREAD_SERIALIZED,
        "MPI: this MPI library cannot be called from more than one thread (thread level " +
            std::to_string(provided) + "); Loom needs MPI_THREAD_SERIALIZED");
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Finalize();
  });
}

// One MPI communicator: the world, or a group split from it (freed with the object).
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // errors become loom::Error
    ok(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    ok(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // The ranks that share memory with this one (collective, as construction is).
    MPI_Comm local = MPI_COMM_NULL;
    ok(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
       "MPI_Comm_split_type");
    int local_size = 0;
    ok(MPI_Comm_size(local, &local_size), "MPI_Comm_size");
    MPI_Comm_free(&local);
    spans_machines_ = local_size < size_;  // then true on every rank
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized)
      MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm part = MPI_COMM_NULL;
    ok(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(part, true);
  }
  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool spans_machines() const override { return spans_machines_; }
  void all_reduce_sum(std::span<float> data) override {
    Timed timed(CollectiveKind::all_reduce, data.size_bytes());
    in_pieces(data.size(), [&](std::size_t at, int count) {
      ok(MPI_Allreduce(MPI_IN_PLACE, data.data() + at, count, MPI_FLOAT, MPI_SUM, comm_),
         "MPI_Allreduce");
    });
  }
  void send(std::span<const float> data, int dest) override {
    Timed timed(CollectiveKind::point_to_point, data.size_bytes());
    in_pieces(data.size(), [&](std::size_t at, int count) {
      ok(MPI_Send(data.data() + at, count, MPI_FLOAT, dest, 0, comm_), "MPI_Send");
    });
  }
  void receive(std::span<float> data, int source) override {
    Timed timed(CollectiveKind::point_to_point, data.size_bytes());
    in_pieces(data.size(), [&](std::size_t at, int count) {
      ok(MPI_Recv(data.data() + at, count, MPI_FLOAT, source, 0, comm_, MPI_STATUS_IGNORE),
         "MPI_Recv");
    });
  }
  void send_receive(std::span<const float> send_data, int dest, std::span<float> receive_data,
                    int source) override {
    Timed timed(CollectiveKind::point_to_point, send_data.size_bytes() + receive_data.size_bytes());
    check(send_data.size() <= INT_MAX && receive_data.size() <= INT_MAX,
          "mpi: send_receive of more than 2^31 floats");
    ok(MPI_Sendrecv(send_data.data(), static_cast<int>(send_data.size()), MPI_FLOAT, dest, 0,
                    receive_data.data(), static_cast<int>(receive_data.size()), MPI_FLOAT, source,
                    0, comm_, MPI_STATUS_IGNORE),
       "MPI_Sendrecv");
  }
  void all_gather(std::span<const float> local, std::span<float> all) override {
    Timed timed(CollectiveKind::all_gather, all.size_bytes());
    check(local.size() <= INT_MAX && all.size() == local.size() * static_cast<std::size_t>(size_),
          "mpi: all_gather of " + std::to_string(local.size()) + " floats into " +
              std::to_string(all.size()));
    ok(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT, all.data(),
                     static_cast<int>(local.size()), MPI_FLOAT, comm_),
       "MPI_Allgather");
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> local) override {
    Timed timed(CollectiveKind::reduce_scatter, all.size_bytes());
    check(local.size() <= INT_MAX && all.size() == local.size() * static_cast<std::size_t>(size_),
          "mpi: reduce_scatter of " + std::to_string(all.size()) + " floats into " +
              std::to_string(local.size()));
    ok(MPI_Reduce_scatter_block(all.data(), local.data(), static_cast<int>(local.size()), MPI_FLOAT,
                                MPI_SUM, comm_),
       "MPI_Reduce_scatter_block");
  }
  void reduce_scatter_sum_uneven(std::span<const float> all, std::span<float> local,
                                 std::span<const int> counts) override {
    Timed timed(CollectiveKind::reduce_scatter, all.size_bytes());
    std::size_t total = 0;
    for (int c : counts)
      total += static_cast<std::size_t>(c);
    check(counts.size() == static_cast<std::size_t>(size_) && total == all.size() &&
              local.size() == static_cast<std::size_t>(counts[static_cast<std::size_t>(rank_)]),
          "mpi: reduce_scatter of " + std::to_string(all.size()) + " floats in " +
              std::to_string(counts.size()) + " blocks summing to " + std::to_string(total) + ", " +
              std::to_string(local.size()) + " here");
    ok(MPI_Reduce_scatter(all.data(), local.data(), counts.data(), MPI_FLOAT, MPI_SUM, comm_),
       "MPI_Reduce_scatter");
  }
  void broadcast(std::span<std::byte> data, int root) override {
    Timed timed(CollectiveKind::broadcast, data.size());
    in_pieces(data.size(), [&](std::size_t at, int count) {
      ok(MPI_Bcast(data.data() + at, count, MPI_BYTE, root, comm_), "MPI_Bcast");
    });
  }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  bool spans_machines_ = false;
};

}  // namespace

std::unique_ptr<Communicator> mpi_world() {
  initialize_once();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

void abort_job_after_failure(int exit_code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1)
    MPI_Abort(MPI_COMM_WORLD, exit_code);
}
#else
std::unique_ptr<Communicator> mpi_world() {
  return nullptr;
}

void abort_job_after_failure(int) {}
#endif

}  // namespace loom::dist
