#include "dist/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dispatch/dispatch.h"
#include "dist/mpi_communicator.h"

namespace loom::dist {
namespace {

class SingleProcess final : public Communicator {
 public:
  std::string_view name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(std::span<float>) override {}
  void broadcast(std::span<std::byte>, int root) override {
    check(root == 0, "broadcast from rank " + std::to_string(root) + " in a one-process job");
  }
  void send(std::span<const float>, int dest) override {
    throw Error("send to rank " + std::to_string(dest) + " in a one-process job");
  }
  void receive(std::span<float>, int source) override {
    throw Error("receive from rank " + std::to_string(source) + " in a one-process job");
  }
  void send_receive(std::span<const float>, int dest, std::span<float>, int) override {
    throw Error("send to rank " + std::to_string(dest) + " in a one-process job");
  }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SingleProcess>();
  }
};

// Launchers announce themselves in the environment (Open MPI, MPICH/Hydra, PMIx, Slurm's PMI).
bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr)
      return true;
  return false;
}

}  // namespace

std::unique_ptr<Communicator> single_process() {
  return std::make_unique<SingleProcess>();
}

namespace {
void check_parts(std::size_t local, std::size_t all, int size, const char* what) {
  check(all == local * static_cast<std::size_t>(size),
        std::string(what) + ": " + std::to_string(all) + " floats are not " + std::to_string(size) +
            " parts of " + std::to_string(local));
}
}  // namespace

void Communicator::all_gather(std::span<const float> local, std::span<float> all) {
  check_parts(local.size(), all.size(), size(), "all_gather");
  // Every other rank contributes zeros here: x + 0 is x exactly, so the sum is the gather.
  std::fill(all.begin(), all.end(), 0.0f);
  std::copy(local.begin(), local.end(),
            all.begin() + static_cast<std::ptrdiff_t>(local.size()) * rank());
  all_reduce_sum(all);
}

void Communicator::reduce_scatter_sum(std::span<const float> all, std::span<float> local) {
  check_parts(local.size(), all.size(), size(), "reduce_scatter_sum");
  std::vector<float> sum(all.begin(), all.end());
  all_reduce_sum(sum);
  const auto at = sum.begin() + static_cast<std::ptrdiff_t>(local.size()) * rank();
  std::copy(at, at + static_cast<std::ptrdiff_t>(local.size()), local.begin());
}

void Communicator::reduce_scatter_sum_uneven(std::span<const float> all, std::span<float> local,
                                             std::span<const int> counts) {
  check(counts.size() == static_cast<std::size_t>(size()),
        "reduce_scatter_sum_uneven: " + std::to_string(counts.size()) + " counts for " +
            std::to_string(size()) + " ranks");
  std::size_t before = 0, total = 0;
  for (int r = 0; r < size(); ++r) {
    if (r < rank())
      before += static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
    total += static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
  }
  check(total == all.size() &&
            local.size() == static_cast<std::size_t>(counts[static_cast<std::size_t>(rank())]),
        "reduce_scatter_sum_uneven: " + std::to_string(all.size()) +
            " floats for blocks summing to " + std::to_string(total) + ", " +
            std::to_string(local.size()) + " here");
  std::vector<float> sum(all.begin(), all.end());
  all_reduce_sum(sum);
  std::copy_n(sum.begin() + static_cast<std::ptrdiff_t>(before), local.size(), local.begin());
}

namespace {
std::mutex totals_mutex;
std::vector<CollectiveTotals> totals(kCollectiveKinds);
std::atomic<std::thread::id> training_thread{};
}  // namespace

const char* collective_name(CollectiveKind kind) {
  static constexpr const char* kNames[kCollectiveKinds] = {
      "all_reduce", "all_gather", "reduce_scatter", "broadcast", "point_to_point"};
  return kNames[static_cast<int>(kind)];
}

std::vector<CollectiveTotals> collective_totals() {
  std::lock_guard lock(totals_mutex);
  return totals;
}

void record_collective(CollectiveKind kind, std::size_t bytes, double seconds) {
  const bool behind = training_thread.load() != std::thread::id{} &&
                      training_thread.load() != std::this_thread::get_id();
  std::lock_guard lock(totals_mutex);
  CollectiveTotals& t = totals[static_cast<std::size_t>(kind)];
  ++t.calls;
  t.bytes += static_cast<double>(bytes);
  t.seconds += seconds;
  if (behind) {
    ++t.overlapped_calls;
    t.overlapped_seconds += seconds;
  }
}

void mark_training_thread() {
  training_thread.store(std::this_thread::get_id());
}

Communicator& world() {
  static std::unique_ptr<Communicator> instance = [] {
    if (launched_by_mpi()) {
      std::unique_ptr<Communicator> mpi = mpi_world();
      check(mpi != nullptr,
            "launched by an MPI launcher, but this build of loom has no MPI (install "
            "libopenmpi-dev and rebuild)");
      return mpi;
    }
    return single_process();
  }();
  return *instance;
}

namespace {
// `t`'s floats into `out` (a host copy where the tensor is not contiguous host memory).
void copy_out(const Tensor& t, float* out) {
  if (t.backend().host_accessible() && t.is_contiguous()) {
    std::memcpy(out, t.data<float>(), static_cast<std::size_t>(t.numel()) * sizeof(float));
    return;
  }
  const std::vector<float> values = t.to_floats();
  std::copy(values.begin(), values.end(), out);
}

// Replaces each gradient in `grads` by its mean over the processes: one all-reduce of them
// packed in order into `flat`. Host-contiguous gradients are read and written in place
// (nothing else holds a gradient after the backward pass); any other is copied through
// the host and `replace(i, mean)` receives its new value.
void average_packed(Communicator& comm, const std::vector<Tensor>& grads, std::vector<float>& flat,
                    const std::function<void(std::size_t, Tensor)>& replace) {
  auto direct = [](const Tensor& g) { return g.backend().host_accessible() && g.is_contiguous(); };
  std::size_t total = 0;
  for (const Tensor& g : grads)
    total += static_cast<std::size_t>(g.numel());
  flat.resize(total);
  std::size_t at = 0;
  for (const Tensor& g : grads) {
    copy_out(g, flat.data() + at);
    at += static_cast<std::size_t>(g.numel());
  }
  comm.all_reduce_sum(flat);
  const float inv = 1.0f / static_cast<float>(comm.size());
  at = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    auto n = static_cast<std::size_t>(g.numel());
    const float* sum = flat.data() + at;
    if (direct(g)) {
      float* out = g.data<float>();
      for (std::size_t k = 0; k < n; ++k)
        out[k] = sum[k] * inv;
    } else {
      std::vector<float> mean(sum, sum + n);
      for (float& v : mean)
        v *= inv;
      replace(i, Tensor::from_floats(g.shape(), mean, g.backend()));
    }
    at += n;
  }
}

}  // namespace

void GradientAverager::average(std::vector<nn::Parameter>& params) {
  if (comm_.size() == 1)
    return;
  std::vector<Tensor> grads;
  std::vector<nn::Parameter*> owners;
  for (nn::Parameter& p : params)
    if (p.var.grad().defined()) {
      grads.push_back(p.var.grad());
      owners.push_back(&p);
    }
  average_packed(comm_, grads, flat_,
                 [&](std::size_t i, Tensor mean) { owners[i]->var.state()->grad = mean; });
}

OverlappedAverager::OverlappedAverager(Communicator& comm, std::size_t bucket_bytes, bool to_owners)
    : comm_(comm),
      bucket_bytes_(std::max<std::size_t>(bucket_bytes, sizeof(float))),
      to_owners_(to_owners) {}

void OverlappedAverager::ready(const Tensor& grad, int owner) {
  if (!grad.backend().host_accessible() || !grad.is_contiguous() || grad.dtype() != DType::f32)
    throw Error("overlapped gradient averaging needs contiguous f32 host gradients, got " +
                grad.describe());
  check(!to_owners_ || (owner >= 0 && owner < comm_.size()),
        "overlapped reduce-scatter: gradient " + grad.describe() + " names owner " +
            std::to_string(owner) + " of " + std::to_string(comm_.size()) + " ranks");
  // Buckets close by the order and sizes of ready() calls alone, never by timing, so every
  // rank all-reduces the same buckets.
  filling_.push_back(grad);
  filling_owners_.push_back(owner);
  filling_bytes_ += grad.nbytes();
  if (filling_bytes_ >= bucket_bytes_)
    close_bucket();
}

void OverlappedAverager::close_bucket() {
  std::size_t slot = closed_this_step_++;
  if (buckets_.size() <= slot)
    buckets_.resize(slot + 1);
  std::vector<float>* flat = &buckets_[slot];
  if (to_owners_)
    stream_.submit([this, members = std::move(filling_), owners = std::move(filling_owners_),
                    flat] { scatter_to_owners(members, owners, *flat); });
  else
    stream_.submit([this, members = std::move(filling_), flat] {
      // A replayed step's gradients are its graph's own buffers: they must be averaged where
      // they are.
      average_packed(comm_, members, *flat, [](std::size_t, const Tensor&) {
        throw Error("overlapped gradient averaging needs the gradients in host memory");
      });
    });
  stream_.signal(reduced_, ++closed_total_);
  filling_.clear();
  filling_owners_.clear();
  filling_bytes_ = 0;
}

void OverlappedAverager::scatter_to_owners(const std::vector<Tensor>& members,
                                           const std::vector<int>& owners,
                                           std::vector<float>& flat) {
  // The bucket packed by owner (rank 0's gradients first, each rank's in ready() order),
  // followed by room for this rank's block of sums.
  const auto ranks = static_cast<std::size_t>(comm_.size());
  std::vector<int> counts(ranks, 0);
  std::vector<std::size_t> order(members.size());
  for (std::size_t k = 0; k < members.size(); ++k) {
    order[k] = k;
    counts[static_cast<std::size_t>(owners[k])] += static_cast<int>(members[k].numel());
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return owners[a] < owners[b]; });
  std::size_t total = 0;
  for (int c : counts)
    total += static_cast<std::size_t>(c);
  const auto mine = static_cast<std::size_t>(counts[static_cast<std::size_t>(comm_.rank())]);
  flat.resize(total + mine);
  std::size_t at = 0;
  for (std::size_t k : order) {
    copy_out(members[k], flat.data() + at);
    at += static_cast<std::size_t>(members[k].numel());
  }
  std::span<float> sums(flat.data() + total, mine);
  comm_.reduce_scatter_sum_uneven(std::span<const float>(flat.data(), total), sums, counts);
  const float inv = 1.0f / static_cast<float>(comm_.size());
  const float* sum = sums.data();
  for (std::size_t k : order) {
    if (owners[k] != comm_.rank())
      continue;
    float* out = members[k].data<float>();
    const auto n = static_cast<std::size_t>(members[k].numel());
    for (std::size_t e = 0; e < n; ++e)
      out[e] = sum[e] * inv;  // the mean, as GradientAverager forms it
    sum += n;
  }
}

void OverlappedAverager::finish() {
  if (!filling_.empty())
    close_bucket();
  buckets_last_step_ = closed_this_step_;
  closed_this_step_ = 0;
  stream_.synchronize();
}

Tensor slice_of(const Tensor& whole, int dim, int index, int count) {
  const std::int64_t n = whole.dim(dim) / count;
  return dispatch::contiguous(whole.slice(dim, index * n, (index + 1) * n));
}

Tensor whole_of(Communicator& group, const Tensor& slice, int dim, int parts) {
  const std::vector<float> local = slice.to_floats();
  const std::size_t ranks = static_cast<std::size_t>(group.size()),
                    count = parts > 0 ? static_cast<std::size_t>(parts) : ranks,
                    holders = ranks / count, n = local.size();
  std::vector<float> all(n * ranks);
  group.all_gather(local, all);
  Shape shape = slice.shape();
  shape[static_cast<std::size_t>(dim)] *= static_cast<std::int64_t>(count);
  // Slice k is rank k * holders's. Viewed as [outer, slice's dim.., inner]: the slices'
  // blocks of `cols` floats (the dimension and those after it) interleave per outer index.
  std::size_t outer = 1;
  for (int d = 0; d < dim; ++d)
    outer *= static_cast<std::size_t>(slice.dim(d));
  const std::size_t cols = n / std::max<std::size_t>(outer, 1);
  std::vector<float> whole(n * count);
  for (std::size_t k = 0; k < count; ++k)
    for (std::size_t i = 0; i < outer; ++i)
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(k * holders * n + i * cols), cols,
                  whole.begin() + static_cast<std::ptrdiff_t>(i * cols * count + k * cols));
  return Tensor::from_floats(shape, whole, slice.backend());
}

Tensor broadcast_tensor(Communicator& comm, const Tensor& value, const Shape& shape,
                        Backend& backend, int root) {
  std::vector<float> v = comm.rank() == root
                             ? value.to_floats()
                             : std::vector<float>(static_cast<std::size_t>(shape_numel(shape)));
  comm.broadcast(std::as_writable_bytes(std::span<float>(v)), root);
  return Tensor::from_floats(shape, v, backend);
}

void broadcast_parameters(Communicator& comm, std::vector<nn::Parameter>& params) {
  if (comm.size() == 1)
    return;
  for (nn::Parameter& p : params) {
    const Tensor& value = p.var.value();
    p.var.set_value(broadcast_tensor(comm, value, value.shape(), value.backend(), 0));
  }
}

OptimizerSharding::OptimizerSharding(Communicator& comm, std::vector<nn::Parameter>& params,
                                     const std::function<bool(std::size_t)>& included)
    : comm_(comm) {
  // Largest first, each to the rank with the fewest elements so far (ties: lowest rank).
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!included || included(i))
      order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return params[a].var.value().numel() > params[b].var.value().numel();
  });
  std::vector<std::int64_t> load(static_cast<std::size_t>(comm.size()), 0);
  owner_.assign(params.size(), -1);
  for (std::size_t i : order) {
    auto lightest = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = lightest;
    load[static_cast<std::size_t>(lightest)] += params[i].var.value().numel();
  }
  owned_by_.resize(static_cast<std::size_t>(comm.size()));
  for (std::size_t i = 0; i < params.size(); ++i)
    if (owner_[i] >= 0)
      owned_by_[static_cast<std::size_t>(owner_[i])].push_back(i);
  segment_ = static_cast<std::size_t>(*std::max_element(load.begin(), load.end()));
}

std::vector<bool> OptimizerSharding::owned_here() const {
  std::vector<bool> owned(owner_.size());
  for (std::size_t i = 0; i < owner_.size(); ++i)
    owned[i] = owner_[i] == comm_.rank();
  return owned;
}

void OptimizerSharding::reduce_scatter_gradients(std::vector<nn::Parameter>& params) {
  if (comm_.size() == 1)
    return;
  const auto ranks = static_cast<std::size_t>(comm_.size());
  all_.assign(ranks * segment_, 0.0f);  // padding and gradient-less parameters add zeros
  for (std::size_t r = 0; r < ranks; ++r) {
    float* at = all_.data() + r * segment_;
    for (std::size_t i : owned_by_[r]) {
      const Tensor& grad = params[i].var.grad();
      if (grad.defined())
        copy_out(grad, at);
      at += static_cast<std::size_t>(params[i].var.value().numel());
    }
  }
  mine_.resize(segment_);
  comm_.reduce_scatter_sum(all_, mine_);
  const float inv = 1.0f / static_cast<float>(comm_.size());
  const float* sum = mine_.data();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor& grad = params[i].var.state()->grad;
    if (owner_[i] < 0)
      continue;  // not sharded here
    if (owner_[i] != comm_.rank()) {
      grad = Tensor();  // not this rank's to update
      continue;
    }
    const auto n = static_cast<std::size_t>(params[i].var.value().numel());
    if (grad.defined()) {
      std::vector<float> mean(sum, sum + n);
      for (float& v : mean)
        v *= inv;  // the mean, as GradientAverager forms it
      if (grad.backend().host_accessible() && grad.is_contiguous())
        std::copy(mean.begin(), mean.end(), grad.data<float>());
      else
        grad = Tensor::from_floats(grad.shape(), mean, grad.backend());
    }
    sum += n;
  }
}

void OptimizerSharding::drop_others_gradients(std::vector<nn::Parameter>& params) const {
  for (std::size_t i = 0; i < params.size(); ++i)
    if (owner_[i] >= 0 && owner_[i] != comm_.rank())
      params[i].var.zero_grad();
}

void OptimizerSharding::all_gather_parameters(std::vector<nn::Parameter>& params) {
  if (comm_.size() == 1)
    return;
  mine_.assign(segment_, 0.0f);
  float* at = mine_.data();
  for (std::size_t i : owned_by_[static_cast<std::size_t>(comm_.rank())]) {
    copy_out(params[i].var.value(), at);
    at += static_cast<std::size_t>(params[i].var.value().numel());
  }
  all_.resize(static_cast<std::size_t>(comm_.size()) * segment_);
  comm_.all_gather(mine_, all_);
  for (std::size_t r = 0; r < owned_by_.size(); ++r) {
    const float* from = all_.data() + r * segment_;
    for (std::size_t i : owned_by_[r]) {
      const Tensor& value = params[i].var.value();
      const auto n = static_cast<std::size_t>(value.numel());
      if (static_cast<int>(r) != comm_.rank())
        params[i].var.set_value(Tensor::from_floats(
            value.shape(), std::vector<float>(from, from + n), value.backend()));
      from += n;
    }
  }
}

void OptimizerSharding::gather_moments(std::vector<Tensor>& first, std::vector<Tensor>& second,
                                       const std::vector<nn::Parameter>& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (owner_[i] < 0)
      continue;
    const Tensor& value = params[i].var.value();
    first[i] = broadcast_tensor(comm_, first[i], value.shape(), value.backend(), owner_[i]);
    second[i] = broadcast_tensor(comm_, second[i], value.shape(), value.backend(), owner_[i]);
  }
}

double mean_over_ranks(Communicator& comm, double value) {
  float v = static_cast<float>(value);
  if (comm.size() == 1)
    return value;
  comm.all_reduce_sum(std::span<float>(&v, 1));
  return static_cast<double>(v) / comm.size();
}

}  // namespace loom::dist
