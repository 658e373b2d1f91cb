// Reader: nn::OnnxModel (io::read_onnx and the importer), then what `loom onnx` and
// `loom train --model onnx` do with a model: inference on inputs of the declared shapes
// (as the replay test Onnx.FuzzFixturesGiveNamedErrors does), and one training step
// (forward with training on, cross-entropy or sum loss, backward, one AdamW update).
//
// The inputs are made here, so their size is capped here: a declared dimension that is
// symbolic or unknown becomes 1, and a model whose declared inputs would hold more than
// kMaxInputElements elements (or a rank above kMaxRank) is skipped -- that is the
// harness's own allocation, not the reader's. What the model computes from the inputs
// (Expand, Tile, ConstantOfShape, ...) is not capped: an allocation past -malloc_limit_mb
// there is a finding.
// Regressions: tests/fixtures/fuzz/onnx_model/ (the input file as it is).
#include <cstdint>
#include <vector>

#include "autograd/functions.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "nn/onnx_model.h"
#include "optim/adamw.h"

namespace {

namespace ag = loom::autograd;
using loom::DType;
using loom::Shape;
using loom::Tensor;

constexpr std::int64_t kMaxInputElements = std::int64_t{1} << 16;  // per input, and in all
constexpr std::size_t kMaxRank = 8;

// Inputs of the declared shapes: f32 in [-1, 1) from a fixed generator, integers 0
// (valid indices for Gather and friends), of the declared integer type. False when the
// declared inputs are too large to make.
bool declared_inputs(const loom::nn::OnnxModel& model, std::vector<Tensor>& inputs) {
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  std::int64_t total = 0;
  for (const loom::io::OnnxValueInfo& in : model.graph().inputs) {
    if (in.shape.size() > kMaxRank)
      return false;
    Shape shape;
    std::int64_t numel = 1;
    for (std::int64_t d : in.shape) {
      const std::int64_t dim = d < 0 ? 1 : d;
      if (__builtin_mul_overflow(numel, dim, &numel) || numel > kMaxInputElements)
        return false;
      shape.push_back(dim);
    }
    if (__builtin_add_overflow(total, numel, &total) || total > kMaxInputElements)
      return false;
    const auto n = static_cast<std::size_t>(numel);
    auto& cpu = loom::cpu::backend();
    switch (in.dtype) {
      case DType::f32: {
        std::vector<float> v(n);
        for (float& x : v) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          x = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        inputs.push_back(Tensor::from_host(shape, DType::f32, v.data(), cpu));
        break;
      }
      case DType::i64: {
        std::vector<std::int64_t> v(n, 0);
        inputs.push_back(Tensor::from_host(shape, DType::i64, v.data(), cpu));
        break;
      }
      case DType::i32: {
        std::vector<std::int32_t> v(n, 0);
        inputs.push_back(Tensor::from_host(shape, DType::i32, v.data(), cpu));
        break;
      }
      case DType::u8: {
        std::vector<std::uint8_t> v(n, 0);
        inputs.push_back(Tensor::from_host(shape, DType::u8, v.data(), cpu));
        break;
      }
      default:  // read_onnx declares no other input type
        return false;
    }
  }
  return true;
}

// One step as the trainer takes it (train/step_modes.cpp): a one-input model is a Model,
// forward gives logits [rows, classes] and the loss is cross-entropy; otherwise the sum
// of the first output.
void training_step(loom::nn::OnnxModel& model, const std::vector<Tensor>& inputs) {
  ag::Tape tape;
  const loom::nn::ForwardOptions options{true, 1};
  ag::Var loss;
  if (inputs.size() == 1) {
    ag::Var logits = model.forward(tape, inputs[0], options);
    if (logits.shape().size() == 2 && logits.shape()[1] > 0) {
      std::vector<std::int32_t> targets(static_cast<std::size_t>(logits.shape()[0]), 0);
      loss = ag::cross_entropy(
          tape, logits, Tensor::from_ints({logits.shape()[0]}, targets, loom::cpu::backend()));
    } else {
      loss = ag::sum(tape, logits);
    }
  } else {
    loss = ag::sum(tape, model.run(tape, inputs, options).front());
  }
  if (!loss.requires_grad() || model.parameters().empty())
    return;  // nothing to train
  tape.backward(loss);
  loom::optim::AdamW adamw(model.parameters(), {});
  adamw.step(1e-3);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::single_threaded();
  loom::cpu::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path =
      loom::fuzz::write_scratch("model.onnx", {reinterpret_cast<const char*>(data), size});
  try {
    loom::nn::OnnxModel model(path, loom::cpu::backend());
    (void)model.coverage();
    (void)model.capturable();
    std::vector<Tensor> inputs;
    if (declared_inputs(model, inputs)) {
      try {
        (void)model.evaluate(inputs);
      } catch (const loom::Error&) {
      }
      try {
        training_step(model, inputs);
      } catch (const loom::Error&) {
      }
    }
  } catch (const loom::Error&) {
  }
  loom::cpu::backend().release_cached_memory();
  return 0;
}
