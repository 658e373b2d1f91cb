#include "dist/communicator.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
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

void average_gradients(Communicator& comm, std::vector<nn::Parameter>& params) {
  if (comm.size() == 1)
    return;
  std::vector<float> flat;
  for (const nn::Parameter& p : params) {
    if (!p.var.grad().defined())
      continue;
    std::vector<float> g = p.var.grad().to_floats();
    flat.insert(flat.end(), g.begin(), g.end());
  }
  comm.all_reduce_sum(flat);
  const float inv = 1.0f / static_cast<float>(comm.size());
  for (float& v : flat)
    v *= inv;
  std::size_t at = 0;
  for (nn::Parameter& p : params) {
    const Tensor& g = p.var.grad();
    if (!g.defined())
      continue;
    auto n = static_cast<std::size_t>(g.numel());
    p.var.state()->grad =
        Tensor::from_floats(g.shape(), std::span<const float>(flat.data() + at, n), g.backend());
    at += n;
  }
}

void broadcast_parameters(Communicator& comm, std::vector<nn::Parameter>& params) {
  if (comm.size() == 1)
    return;
  for (nn::Parameter& p : params) {
    const Tensor& value = p.var.value();
    std::vector<float> v = value.to_floats();
    comm.broadcast(std::as_writable_bytes(std::span<float>(v)), 0);
    p.var.set_value(Tensor::from_floats(value.shape(), v, value.backend()));
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
