// dist/communicator.h — collectives over the processes of one training job (floor 6).
//
// Data parallelism needs three things from the processes: who am I (rank, size), sum a
// buffer across all of them (all-reduce), and give everyone rank 0's bytes (broadcast).
// MPI provides them when `loom` is launched by mpirun and the build found MPI; otherwise
// the job is one process and every collective is the identity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/host_stream.h"
#include "nn/model.h"

namespace loom::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;  // "single", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[i] <- sum over ranks of data[i], on every rank.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // data <- rank `root`'s data, on every rank.
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  // all[r n, (r+1) n) <- rank r's `local` (n = local.size(), the same on every rank; all holds
  // n size() floats), on every rank. Tensor parallelism's gather of shards.
  virtual void all_gather(std::span<const float> local, std::span<float> all);
  // local <- the sum over ranks of their all[rank() n, (rank()+1) n) (n = local.size()): the
  // all-reduce's sums, each rank keeping only its own slice. Both default to an all-reduce
  // (of zeros around the local part, or of a copy), which is exact; MPI and the in-process
  // group do them natively.
  virtual void reduce_scatter_sum(std::span<const float> all, std::span<float> local);
  // The same with blocks of their own sizes (MPI_Reduce_scatter): rank r's block of `all` is
  // counts[r] floats after the blocks before it; local.size() is counts[rank()].
  virtual void reduce_scatter_sum_uneven(std::span<const float> all, std::span<float> local,
                                         std::span<const int> counts);
  // Point to point (pipeline stages): blocks until `dest` has the data / it has arrived
  // from `source`. Messages between two ranks arrive in the order they were sent.
  virtual void send(std::span<const float> data, int dest) = 0;
  virtual void receive(std::span<float> data, int source) = 0;
  // A send and a receive that proceed together (MPI_Sendrecv): two ranks that exchange
  // this way cannot block each other.
  virtual void send_receive(std::span<const float> send_data, int dest,
                            std::span<float> receive_data, int source) = 0;
  // The ranks that pass the same `color` form a new communicator, ranked by `key`
  // (collective: every rank calls it). Pipeline x data parallelism splits the world so.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // True when the ranks run on more than one machine. On one machine the collectives
  // are memory copies done by the same cores that compute, so overlapping them with the
  // compute cannot hide them.
  virtual bool spans_machines() const { return false; }
};

// What this process's collectives over MPI cost, by kind, since it started (thread-safe:
// the overlapped averager's communication thread records too). `overlapped` counts the
// calls made off the training thread, behind compute.
enum class CollectiveKind { all_reduce, all_gather, reduce_scatter, broadcast, point_to_point };
inline constexpr int kCollectiveKinds = 5;
const char* collective_name(CollectiveKind kind);  // "all_reduce", ...
struct CollectiveTotals {
  std::int64_t calls = 0, overlapped_calls = 0;
  double bytes = 0, seconds = 0, overlapped_seconds = 0;
};
std::vector<CollectiveTotals> collective_totals();  // indexed by CollectiveKind
// Records one call (the MPI communicator's methods do).
void record_collective(CollectiveKind kind, std::size_t bytes, double seconds);
// The calling thread is the training thread (its calls are not overlapped); set by `loom
// train` at start.
void mark_training_thread();

// One process: size 1, collectives leave the data as it is.
std::unique_ptr<Communicator> single_process();

// The job's communicator: MPI's world when launched by an MPI launcher in a build with
// MPI, else single_process(). Created on first use and kept for the process.
Communicator& world();

// Data-parallel gradient averaging: every parameter's gradient becomes the mean over
// ranks, in one all-reduce of a flat host buffer (one message per step, not one per
// tensor). Parameters without a gradient must be the same on every rank. The buffer is
// kept between steps: a fresh one costs a page fault per 4 KiB each step, which for
// GPT-2 124M was most of the step.
class GradientAverager {
 public:
  explicit GradientAverager(Communicator& comm) : comm_(comm) {}
  void average(std::vector<nn::Parameter>& params);

 private:
  Communicator& comm_;
  std::vector<float> flat_;
};

// Gradient averaging overlapped with the backward pass (graph mode): the replay hands
// over each gradient as soon as it is final; ready() packs them, in that order, into
// buckets of at least `bucket_bytes`, and each full bucket's all-reduce is submitted to
// the job's communication stream (a HostStream: MPI's collectives are host calls) while
// the backward pass goes on. Each reduced bucket signals reduced() (bucket k of the
// averager's life reaches k + 1). finish() closes the last bucket and waits for the
// stream. Gradients must be host-accessible and contiguous; nothing else may touch them
// between ready() and finish(), and nothing else may call the communicator in that time
// (MPI is initialised for one calling thread at a time). For two processes the result is
// bitwise that of GradientAverager (a + b is exact in either order); for more, MPI may
// associate the sums differently per message size.
// For the distributed optimizer (`to_owners`), each gradient names the rank that updates its
// parameter, and each bucket is reduce-scattered instead (MPI_Reduce_scatter with a block per
// rank: the bucket's gradients packed by owner): only the owner's gradients become the mean,
// the others are left as they were for the caller to drop (OptimizerSharding). Each element
// is summed over the same ranks as by OptimizerSharding::reduce_scatter_gradients, so on two
// processes the means are bitwise its (and plain data parallelism's).
class OverlappedAverager {
 public:
  OverlappedAverager(Communicator& comm, std::size_t bucket_bytes, bool to_owners = false);
  OverlappedAverager(const OverlappedAverager&) = delete;
  OverlappedAverager& operator=(const OverlappedAverager&) = delete;

  // This gradient is final; `owner`: the rank that updates its parameter (with to_owners).
  void ready(const Tensor& grad, int owner = -1);
  void finish();  // every gradient of the step was handed over: wait; rethrows a failure
  std::size_t buckets_last_step() const { return buckets_last_step_; }
  Timeline& reduced() { return reduced_; }

 private:
  void close_bucket();  // submits the bucket being filled to the stream
  void scatter_to_owners(const std::vector<Tensor>& members, const std::vector<int>& owners,
                         std::vector<float>& flat);

  Communicator& comm_;
  std::size_t bucket_bytes_;
  bool to_owners_;
  std::vector<Tensor> filling_;  // the bucket being filled
  std::vector<int> filling_owners_;
  std::size_t filling_bytes_ = 0;
  std::size_t closed_this_step_ = 0;
  std::uint64_t closed_total_ = 0;
  // One packing buffer per bucket slot, kept between steps (no page faults). A deque:
  // adding a slot leaves the ones the stream is using where they are.
  std::deque<std::vector<float>> buckets_;
  std::size_t buckets_last_step_ = 0;
  Timeline reduced_;
  HostStream stream_;  // last: destroyed first, running what was submitted while the rest lives
};

// A tensor of `shape` on `backend` holding rank `root`'s `value` (the other ranks' `value`
// is not read and may be undefined).
Tensor broadcast_tensor(Communicator& comm, const Tensor& value, const Shape& shape,
                        Backend& backend, int root);

// Tensor parallelism's slices (nn::ShardedParameter): slice `index` of `count` equal slices
// of `whole` along `dim`.
Tensor slice_of(const Tensor& whole, int dim, int index, int count);
// The whole tensor from the slices the ranks of `group` hold along `dim`: `parts` distinct
// slices (0: one per rank), each held by size / parts consecutive ranks (all-gathered, then
// the first holder's copy of each set side by side).
Tensor whole_of(Communicator& group, const Tensor& slice, int dim, int parts = 0);

// Every rank's parameters become rank 0's (a job starts in sync whatever each rank
// loaded or initialised).
void broadcast_parameters(Communicator& comm, std::vector<nn::Parameter>& params);

// The distributed optimizer (ZeRO stage 1, as Megatron-Core's distributed optimizer moves
// it): each rank keeps the AdamW moments of, and updates, its share of the parameters. The
// gradients are reduce-scattered (each rank receives the mean of its own parameters'
// gradients only: half an all-reduce's traffic) and the updated values all-gathered, both
// through one flat buffer whose rank-r segment holds rank r's parameters in order, padded to
// the largest share. The steps are those of unsharded data parallelism up to the order of
// additions in the gradient norm (each rank's share summed, then the shares); each rank
// holds 1/N of the moments and, between the reduction and the step, of the gradients. In
// graph mode the reduction can instead run during the backward pass, bucket by bucket
// (OverlappedAverager with to_owners, then drop_others_gradients).
class OptimizerSharding {
 public:
  // Owners balance the parameters' element counts over the ranks; only the parameters
  // `included` admits are sharded (a pipeline stage's own: the others have owner -1 and are
  // left alone).
  OptimizerSharding(Communicator& comm, std::vector<nn::Parameter>& params,
                    const std::function<bool(std::size_t)>& included = {});
  int owner(std::size_t parameter) const { return owner_[parameter]; }
  std::vector<bool> owned_here() const;
  // After the backward pass: this rank's parameters get the mean over ranks of their
  // gradients; the others' gradients are dropped. Parameters without a gradient (the same
  // on every rank) are left alone.
  void reduce_scatter_gradients(std::vector<nn::Parameter>& params);
  // After an OverlappedAverager reduce-scattered them to their owners: the others' gradients
  // are dropped (as reduce_scatter_gradients drops them).
  void drop_others_gradients(std::vector<nn::Parameter>& params) const;
  // After the optimizer step: every rank receives the owners' new values.
  void all_gather_parameters(std::vector<nn::Parameter>& params);
  // Every rank receives every moment (before writing a checkpoint); keep_only(owned_here())
  // releases them again.
  void gather_moments(std::vector<Tensor>& first, std::vector<Tensor>& second,
                      const std::vector<nn::Parameter>& params);

 private:
  Communicator& comm_;
  std::vector<int> owner_;
  std::vector<std::vector<std::size_t>> owned_by_;  // per rank: its parameters, in order
  std::size_t segment_ = 0;                         // floats per rank in the flat buffer
  std::vector<float> all_, mine_;                   // the flat buffer and this rank's segment
};

// The mean of one value over ranks.
double mean_over_ranks(Communicator& comm, double value);

}  // namespace loom::dist
