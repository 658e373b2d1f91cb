// ONNX import: a PyTorch-exported model gives PyTorch's outputs on every backend, trains
// in Loom, reports the ops it lacks, and bad files get clear errors.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>

#include "autograd/functions.h"
#include "core/error.h"
#include "io/onnx.h"
#include "nn/onnx_model.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

std::string fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/onnx/" + name;
}

class OnnxOnBackend : public ::testing::TestWithParam<std::string> {};

// Each PyTorch export against PyTorch's own output for its example input.
TEST_P(OnnxOnBackend, ExportsGivePyTorchsOutputs) {
  Backend* device = &backend_named(GetParam());
  for (std::string name : {"mlp_mnist", "transformer_encoder_layer", "tiny_gpt_block"}) {
    SCOPED_TRACE(name);
    nn::OnnxModel model(fixture(name + ".onnx"), *device);
    Tensor x = io::read_onnx_tensor(fixture(name + "/input_0.pb"), cpu());
    Tensor want = io::read_onnx_tensor(fixture(name + "/output_0.pb"), cpu());
    ag::Tape tape;
    tape.set_recording(false);
    Tensor got = model.run(tape, {x}, {}).front().value();
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_LE(worst_ratio(values(got), values(want), 1e-5, 1e-5), 1.0);
  }
}

// The official ONNX backend node tests Loom passes (tests/fixtures/onnx/node: each op's
// reference model, inputs and outputs from onnx v1.22.0), on every backend.
TEST_P(OnnxOnBackend, OfficialNodeTestsPass) {
  Backend* device = &backend_named(GetParam());
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(fixture("node"))) {
    if (!entry.is_directory())
      continue;
    nn::OnnxTestResult r = nn::run_onnx_backend_test(entry.path().string(), *device);
    EXPECT_EQ(r.status, "pass") << r.test << ": " << r.detail;
    ++count;
  }
  EXPECT_GE(count, 189);
}

INSTANTIATE_TEST_SUITE_P(All, OnnxOnBackend, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

TEST(Onnx, ParametersAreThoseOfTheExportedModule) {
  // PyTorch's MLP: 784*128 + 128 + 128*10 + 10. TinyGPTBlock: 60545 parameters; the export
  // adds its -inf attention mask (a constant here, not a parameter) and stores the equal
  // LayerNorm biases once behind Identity nodes (one parameter each here).
  EXPECT_EQ(nn::OnnxModel(fixture("mlp_mnist.onnx"), cpu()).parameter_count(), 101770);
  nn::OnnxModel gpt(fixture("tiny_gpt_block.onnx"), cpu());
  EXPECT_EQ(gpt.parameter_count(), 60545);
  ASSERT_NE(gpt.find("ln.bias"), nullptr);
  ASSERT_NE(gpt.find("layer.self_attn.out_proj.bias"), nullptr);
  EXPECT_NE(gpt.find("ln.bias")->var.state(),
            gpt.find("layer.self_attn.out_proj.bias")->var.state());
}

TEST(Onnx, ImportedModelTrains) {
  // The parameters are the ONNX initializers under their names; gradients reach all of
  // them and a few AdamW steps on one batch lower its loss.
  nn::OnnxModel model(fixture("mlp_mnist.onnx"), cpu());
  ASSERT_EQ(model.parameters().size(), 4u);
  EXPECT_NE(model.find("net.1.weight"), nullptr);
  nn::Rng rng(3);
  Tensor x = random({16, 1, 28, 28}, rng, 0.0f, 1.0f), y = random_ids({16}, 10, rng);
  optim::AdamW optimizer(model.parameters(), {0.9, 0.999, 1e-8, 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    ag::Tape tape;
    ag::Var loss = ag::cross_entropy(tape, model.forward(tape, x, {true, 1}), y);
    tape.backward(loss);
    for (const nn::Parameter& p : model.parameters())
      ASSERT_TRUE(p.var.grad().defined()) << p.name;
    optimizer.step(1e-3);
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.value().item();
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(Onnx, ImportedTransformerTrainsOnTokens) {
  // Token ids in Loom's i32 reach the graph's int64 input; [B,T,V] logits come back as
  // [B*T,V] rows; the embedding, attention and MLP weights all get gradients.
  nn::OnnxModel model(fixture("tiny_gpt_block.onnx"), cpu());
  nn::Rng rng(5);
  Tensor x = random_ids({2, 32}, 65, rng), y = random_ids({64}, 65, rng);
  optim::AdamW optimizer(model.parameters(), {0.9, 0.999, 1e-8, 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    ag::Tape tape;
    ag::Var logits = model.forward(tape, x, {true, static_cast<std::uint64_t>(step)});
    ASSERT_EQ(logits.shape(), (Shape{64, 65}));
    ag::Var loss = ag::cross_entropy(tape, logits, y);
    tape.backward(loss);
    for (const nn::Parameter& p : model.parameters())
      ASSERT_TRUE(p.var.grad().defined()) << p.name;
    optimizer.step(3e-3);
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.value().item();
  }
  EXPECT_LT(last, 0.5 * first);
}

// A one-node model with an op the importer does not map.
std::string write_unsupported_model(const std::string& dir) {
  onnx::ModelProto model;
  model.set_ir_version(7);
  model.add_opset_import()->set_version(14);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type("HardSigmoid");
  node->set_name("hs");
  node->add_input("x");
  node->add_output("y");
  for (const char* name : {"x", "y"}) {
    onnx::ValueInfoProto* v = std::string(name) == "x" ? graph->add_input() : graph->add_output();
    v->set_name(name);
    auto* type = v->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    type->mutable_shape()->add_dim()->set_dim_value(3);
  }
  std::string path = dir + "/hard_sigmoid.onnx";
  std::ofstream out(path, std::ios::binary);
  model.SerializeToOstream(&out);
  return path;
}

TEST(Onnx, ModelsThatReadIntegerInputsOnTheHostAreNotCapturable) {
  EXPECT_TRUE(nn::OnnxModel(fixture("tiny_gpt_block.onnx"), cpu()).capturable());
  EXPECT_TRUE(nn::OnnxModel(fixture("mlp_mnist.onnx"), cpu()).capturable());
  // ids -> Cast -> float: the values are converted on the host, outside any kernel.
  onnx::ModelProto model;
  model.set_ir_version(7);
  model.add_opset_import()->set_version(14);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type("Cast");
  node->add_input("ids");
  node->add_output("y");
  onnx::AttributeProto* to = node->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto_DataType_FLOAT);
  onnx::ValueInfoProto* in = graph->add_input();
  in->set_name("ids");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_INT64);
  graph->add_output()->set_name("y");
  std::string path = temp_dir("onnx_cast") + "/cast.onnx";
  {
    std::ofstream out(path, std::ios::binary);
    model.SerializeToOstream(&out);
  }
  EXPECT_FALSE(nn::OnnxModel(path, cpu()).capturable());
}

TEST(Onnx, CoverageNamesTheOpsLoomLacksAndRunningStopsAtTheFirst) {
  nn::OnnxModel model(write_unsupported_model(temp_dir("onnx_unsupported")), cpu());
  ASSERT_EQ(model.coverage().size(), 1u);
  EXPECT_EQ(model.coverage()[0].op, "HardSigmoid");
  EXPECT_FALSE(model.coverage()[0].supported);
  nn::Rng rng(2);
  ag::Tape tape;
  std::string message = error_of([&] { model.forward(tape, random({3}, rng), {}); });
  EXPECT_NE(message.find("hard_sigmoid.onnx: node 'hs' (HardSigmoid)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("is not supported by Loom's importer yet"), std::string::npos) << message;
  // Every op of the three exports is imported.
  for (std::string name : {"mlp_mnist", "transformer_encoder_layer", "tiny_gpt_block"})
    for (const auto& use : nn::OnnxModel(fixture(name + ".onnx"), cpu()).coverage())
      EXPECT_TRUE(use.supported) << name << ": " << use.op;
}

TEST(Onnx, BadFilesAndInputsGetClearErrors) {
  std::string dir = temp_dir("onnx_bad");
  EXPECT_NE(error_of([&] {
              io::read_onnx(dir + "/absent.onnx", cpu());
            }).find("absent.onnx: cannot open"),
            std::string::npos);
  {
    std::ofstream f(dir + "/text.onnx");
    f << "this is not a protobuf model\n";
  }
  std::string message = error_of([&] { io::read_onnx(dir + "/text.onnx", cpu()); });
  EXPECT_NE(message.find("text.onnx: not an ONNX model"), std::string::npos) << message;
  // A truncated model: the protobuf ends in the middle of a field.
  {
    std::ifstream in(fixture("mlp_mnist.onnx"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(dir + "/cut.onnx", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  message = error_of([&] { io::read_onnx(dir + "/cut.onnx", cpu()); });
  EXPECT_NE(message.find("cut.onnx"), std::string::npos) << message;
  message = error_of([&] { io::read_onnx_tensor(dir + "/text.onnx", cpu()); });
  EXPECT_NE(message.find("text.onnx"), std::string::npos) << message;

  nn::OnnxModel model(fixture("mlp_mnist.onnx"), cpu());
  nn::Rng rng(1);
  ag::Tape tape;
  message = error_of([&] { model.forward(tape, random({2, 1, 28, 27}, rng), {}); });
  EXPECT_NE(message.find("input 'input'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2,1,28,28]"), std::string::npos) << message;
  message = error_of([&] { model.forward(tape, random_ids({2, 784}, 5, rng), {}); });
  EXPECT_NE(message.find("expected f32"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::testing
