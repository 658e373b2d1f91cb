// ONNX import: a PyTorch-exported model gives PyTorch's outputs on every backend, trains
// in Loom, reports the ops it lacks, and bad files get clear errors.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/dispatch.h"
#include "onnx/parser.h"
#include "onnx/model.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace loom::testing {
namespace {

namespace ag = loom::autograd;

std::string fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/onnx/" + name;
}

// Writes a model built in a test to a fresh folder `dir` as `file`; returns its path.
std::string save_model(const onnx::ModelProto& model, const std::string& dir,
                       const std::string& file) {
  const std::string path = temp_dir(dir) + "/" + file;
  std::ofstream out(path, std::ios::binary);
  model.SerializeToOstream(&out);
  return path;
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
    // The README's claim: within 1e-6 of PyTorch, absolute (measured: 8.9e-8 to 7.2e-7).
    EXPECT_LE(worst_ratio(values(got), values(want), 0.0, 1e-6), 1.0);
  }
}

// The official ONNX backend node tests Loom passes (tests/fixtures/onnx/node: each op's
// reference model, inputs and outputs from onnx v1.22.0), on every backend. Under the
// sanitizers, which check the importer's host code (the same on every backend), the cpu
// runs every third and the device backends every tenth: all of them there would add
// minutes to CI, which runs close to its limit.
TEST_P(OnnxOnBackend, OfficialNodeTestsPass) {
  Backend* device = &backend_named(GetParam());
  const int every = !kSanitizedBuild ? 1 : GetParam() == "cpu" ? 3 : 10;
  std::vector<std::filesystem::path> folders;
  for (const auto& entry : std::filesystem::directory_iterator(fixture("node")))
    if (entry.is_directory())
      folders.push_back(entry.path());
  std::sort(folders.begin(), folders.end());
  EXPECT_GE(folders.size(), 1456u);  // docs/onnx-conformance.md: the passing set of onnx 1.22.0
  for (std::size_t i = 0; i < folders.size(); i += static_cast<std::size_t>(every)) {
    nn::OnnxTestResult r = nn::run_onnx_backend_test(folders[i].string(), *device);
    EXPECT_EQ(r.status, "pass") << r.test << ": " << r.detail;
  }
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
  node->set_op_type("STFT");
  node->set_name("stft");
  node->add_input("x");
  node->add_output("y");
  for (const char* name : {"x", "y"}) {
    onnx::ValueInfoProto* v = std::string(name) == "x" ? graph->add_input() : graph->add_output();
    v->set_name(name);
    auto* type = v->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    type->mutable_shape()->add_dim()->set_dim_value(3);
  }
  std::string path = dir + "/stft.onnx";
  std::ofstream out(path, std::ios::binary);
  model.SerializeToOstream(&out);
  return path;
}

// A tensor file with one TensorProto.
std::string write_tensor(const onnx::TensorProto& t, const std::string& name) {
  std::string path = temp_dir("onnx_tensors") + "/" + name;
  std::ofstream out(path, std::ios::binary);
  t.SerializeToOstream(&out);
  return path;
}

TEST(Onnx, NarrowElementTypesAreReadWidened) {
  onnx::TensorProto int4;
  int4.set_data_type(22);  // INT4: two per byte, the first in the low bits, signed
  int4.add_dims(3);
  int4.set_raw_data(std::string("\x7F\x08", 2));
  Tensor v = io::read_onnx_tensor(write_tensor(int4, "int4.pb"), cpu());
  ASSERT_EQ(v.dtype(), DType::i64);
  EXPECT_EQ(std::vector<std::int64_t>(v.data<std::int64_t>(), v.data<std::int64_t>() + 3),
            (std::vector<std::int64_t>{-1, 7, -8}));
  onnx::TensorProto fp8;
  fp8.set_data_type(17);  // FLOAT8E4M3FN: 0x7E is 448, 0x38 is 1
  fp8.add_dims(2);
  fp8.set_raw_data(std::string("\x7E\x38", 2));
  EXPECT_EQ(io::read_onnx_tensor(write_tensor(fp8, "fp8.pb"), cpu()).to_floats(),
            (std::vector<float>{448.0f, 1.0f}));
  int4.set_raw_data(std::string("\x7F", 1));  // 3 values need 2 bytes
  EXPECT_NE(error_of([&] {
              io::read_onnx_tensor(write_tensor(int4, "short.pb"), cpu());
            }).find("holds 1 bytes, the shape [3] needs 2 (4-bit values)"),
            std::string::npos);
  onnx::TensorProto big;
  big.set_data_type(onnx::TensorProto_DataType_UINT64);
  big.add_dims(1);
  big.add_uint64_data(std::uint64_t{1} << 63);
  EXPECT_NE(error_of([&] {
              io::read_onnx_tensor(write_tensor(big, "big.pb"), cpu());
            }).find("UINT64 value 9223372036854775808 is above 2^63 - 1"),
            std::string::npos);
}

// Clip's bounds are settings, not parameters: y = clip(x * w, 0, 6) has one parameter.
TEST(Onnx, AnOpsSettingsAreConstantsNotParameters) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(13);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* mul = graph->add_node();
  mul->set_op_type("Mul");
  mul->add_input("x");
  mul->add_input("w");
  mul->add_output("xw");
  onnx::NodeProto* clip = graph->add_node();
  clip->set_op_type("Clip");
  clip->add_input("xw");
  clip->add_input("lo");
  clip->add_input("hi");
  clip->add_output("y");
  // Then products with two rank-0 initializers: val_7, a literal of the model's code as
  // PyTorch's dynamo exporter names them (GELU's 0.044715), a constant too; and a module's
  // scalar parameter under its module path (CLIP's logit_scale), which trains.
  onnx::NodeProto* literal = graph->add_node();
  literal->set_op_type("Mul");
  literal->add_input("clipped");
  literal->add_input("val_7");
  literal->add_output("scaled");
  onnx::NodeProto* learned = graph->add_node();
  learned->set_op_type("Mul");
  learned->add_input("scaled");
  learned->add_input("logit_scale");
  learned->add_output("y");
  clip->set_output(0, "clipped");
  for (auto [name, value] : {std::pair{"w", 2.0f}, std::pair{"lo", 0.0f}, std::pair{"hi", 6.0f},
                             std::pair{"val_7", 1.0f}, std::pair{"logit_scale", 1.0f}}) {
    onnx::TensorProto* t = graph->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_FLOAT);
    t->add_float_data(value);
    if (std::string(name) == "w")
      t->add_dims(1);
  }
  onnx::ValueInfoProto* in = graph->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_clip", "clip.onnx");
  nn::OnnxModel m(path, cpu());
  ASSERT_EQ(m.parameters().size(), 2u);
  EXPECT_NE(m.find("w"), nullptr);
  EXPECT_NE(m.find("logit_scale"), nullptr);
  Tensor x = Tensor::from_floats({3}, std::vector<float>{-1, 1, 5}, cpu());
  EXPECT_EQ(m.evaluate({x}).front().to_floats(), (std::vector<float>{0, 2, 6}));
}

// Equal on floats, then Where: it runs eagerly on every backend, and while a graph is
// being captured the comparison's read of device values is refused, naming the node.
TEST(Onnx, ReadingDeviceValuesOnTheHostIsRefusedWhileCapturing) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(19);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* equal = graph->add_node();
  equal->set_op_type("Equal");
  equal->set_name("same");
  equal->add_input("a");
  equal->add_input("b");
  equal->add_output("c");
  onnx::NodeProto* pick = graph->add_node();
  pick->set_op_type("Where");
  pick->add_input("c");
  pick->add_input("b");
  pick->add_input("a");
  pick->add_output("y");
  for (const char* name : {"a", "b"}) {
    onnx::ValueInfoProto* in = graph->add_input();
    in->set_name(name);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  }
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_equal", "equal.onnx");
  Tensor a = Tensor::from_floats({3}, std::vector<float>{1, 2, 3}, cpu());
  Tensor b = Tensor::from_floats({3}, std::vector<float>{1, 5, 3}, cpu());
  for (Backend* device : backends()) {  // where(a == b, b, a) is a
    nn::OnnxModel m(path, *device);
    EXPECT_EQ(m.evaluate({a, b}).front().to_floats(), (std::vector<float>{1, 2, 3}))
        << device->name();
  }
  struct Listener : dispatch::Recorder {
    void executed(Backend&, OpId, std::span<const Tensor>, std::span<const Tensor>, const Attrs&,
                  bool) override {}
  } listener;
  nn::OnnxModel m(path, cpu());
  dispatch::Recorder* previous = dispatch::set_recorder(&listener);
  std::string message = error_of([&] { m.evaluate({a, b}); });
  dispatch::set_recorder(previous);
  EXPECT_NE(message.find("node 'same' (Equal)"), std::string::npos) << message;
  EXPECT_NE(message.find("a captured graph"), std::string::npos) << message;
}

// A comparison of values fixed at every step (an exporter's causal mask: ones, Trilu, Equal
// 0) is read on the host while a graph is captured too: a replay could not see it change.
TEST(Onnx, ComparisonsOfConstantsAreReadOnTheHostWhileCapturing) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(19);
  onnx::GraphProto* graph = model.mutable_graph();
  auto constant = [&](const char* name, std::vector<float> values) {
    onnx::NodeProto* node = graph->add_node();
    node->set_op_type("Constant");
    node->add_output(name);
    onnx::AttributeProto* value = node->add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto_DataType_FLOAT);
    value->mutable_t()->add_dims(static_cast<std::int64_t>(values.size()));
    for (float v : values)
      value->mutable_t()->add_float_data(v);
  };
  constant("k", {1, 0, 1});
  constant("zero", {0});
  onnx::NodeProto* equal = graph->add_node();
  equal->set_op_type("Equal");
  equal->add_input("k");
  equal->add_input("zero");
  equal->add_output("c");
  onnx::NodeProto* pick = graph->add_node();
  pick->set_op_type("Where");
  pick->add_input("c");
  pick->add_input("a");
  pick->add_input("b");
  pick->add_output("y");
  for (const char* name : {"a", "b"}) {
    onnx::ValueInfoProto* in = graph->add_input();
    in->set_name(name);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  }
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_fixed_equal", "equal.onnx");
  Tensor a = Tensor::from_floats({3}, std::vector<float>{1, 2, 3}, cpu());
  Tensor b = Tensor::from_floats({3}, std::vector<float>{7, 8, 9}, cpu());
  struct Listener : dispatch::Recorder {
    void executed(Backend&, OpId, std::span<const Tensor>, std::span<const Tensor>, const Attrs&,
                  bool) override {}
  } listener;
  nn::OnnxModel m(path, cpu());
  dispatch::Recorder* previous = dispatch::set_recorder(&listener);
  std::vector<float> y;
  std::string message = error_of([&] { y = m.evaluate({a, b}).front().to_floats(); });
  dispatch::set_recorder(previous);
  EXPECT_EQ(message, "");
  EXPECT_EQ(y, (std::vector<float>{7, 2, 9}));  // where(k == 0, a, b)
}

// Pow with an exponent that is a tensor input (neither a constant nor an integer): float
// pow's values on every backend, a negative base included ((-2)^3 = -8, (-8)^(1/3) NaN).
TEST(Onnx, PowWithATensorExponentIsFloatPow) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(15);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* pow = graph->add_node();
  pow->set_op_type("Pow");
  pow->add_input("x");
  pow->add_input("e");
  pow->add_output("y");
  for (const char* name : {"x", "e"}) {
    onnx::ValueInfoProto* in = graph->add_input();
    in->set_name(name);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  }
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_pow", "pow.onnx");
  const std::vector<float> xs{-2, -2, 2, 0, -8, -3, 0.5f}, es{3, 2, 0.5f, 0, 1.0f / 3, -1, -2};
  Tensor x = Tensor::from_floats({7}, xs, cpu()), e = Tensor::from_floats({7}, es, cpu());
  for (Backend* device : backends()) {
    SCOPED_TRACE(device->name());
    std::vector<float> y = nn::OnnxModel(path, *device).evaluate({x, e}).front().to_floats();
    ASSERT_EQ(y.size(), xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float want = std::pow(xs[i], es[i]);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(y[i])) << i << ": " << y[i];
      else
        EXPECT_NEAR(y[i], want, 1e-6 * std::max(1.0f, std::fabs(want))) << i;
    }
  }
}

// A depthwise convolution with two outputs per channel (group = C, weight [2C, 1, 3, 3]),
// stride 2, against one conv2d per output channel over its input channel.
TEST(Onnx, DepthwiseConvolutionIsAConvolutionPerChannel) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(13);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* conv = graph->add_node();
  conv->set_op_type("Conv");
  for (const char* name : {"x", "w", "b"})
    conv->add_input(name);
  conv->add_output("y");
  auto ints = [&](const char* name, std::vector<std::int64_t> values) {
    onnx::AttributeProto* a = conv->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (std::int64_t v : values)
      a->add_ints(v);
  };
  ints("strides", {2, 2});
  ints("pads", {1, 1, 1, 1});
  onnx::AttributeProto* group = conv->add_attribute();
  group->set_name("group");
  group->set_type(onnx::AttributeProto::INT);
  group->set_i(3);
  for (const char* name : {"x", "w", "b"}) {
    onnx::ValueInfoProto* in = graph->add_input();
    in->set_name(name);
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  }
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_depthwise", "depthwise.onnx");
  nn::Rng rng(23);
  Tensor x = random({2, 3, 7, 7}, rng), w = random({6, 1, 3, 3}, rng), b = random({6}, rng);
  ag::Tape tape;
  tape.set_recording(false);
  std::vector<ag::Var> per_channel;
  for (std::int64_t o = 0; o < 6; ++o)
    per_channel.push_back(ag::conv2d(tape, ag::slice(tape, ag::Var(x), 1, o / 2, o / 2 + 1),
                                     ag::slice(tape, ag::Var(w), 0, o, o + 1),
                                     ag::slice(tape, ag::Var(b), 0, o, o + 1), 2, 1));
  const std::vector<double> want = values(ag::concat(tape, per_channel, 1).value());
  for (Backend* device : backends()) {
    Tensor y = nn::OnnxModel(path, *device).evaluate({x, w, b}).front();
    EXPECT_EQ(y.shape(), (Shape{2, 6, 4, 4})) << device->name();
    EXPECT_LE(worst_ratio(values(y), want, 1e-5, 1e-6), 1.0) << device->name();
  }
}

// Loop(3) of v <- v * w with the scan output v, and an If on a constant choosing a branch
// that reads the loop's result from the enclosing scope: the values and the gradient
// (d sum(x w^3) / dw = 3 x w^2) on every backend; graph mode refuses the model by name.
TEST(Onnx, ControlFlowRunsAndTrainsEagerly) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(16);
  onnx::GraphProto* graph = model.mutable_graph();
  auto float_value = [](onnx::ValueInfoProto* v, const char* name) {
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  };
  auto add_constant = [](onnx::GraphProto* g, const char* name, onnx::TensorProto_DataType type,
                         std::int64_t value) {
    onnx::TensorProto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    if (type == onnx::TensorProto_DataType_INT64)
      t->add_int64_data(value);
    else
      t->add_int32_data(static_cast<std::int32_t>(value));
  };
  add_constant(graph, "trips", onnx::TensorProto_DataType_INT64, 3);
  add_constant(graph, "yes", onnx::TensorProto_DataType_BOOL, 1);
  onnx::TensorProto* w = graph->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto_DataType_FLOAT);
  w->add_dims(2);
  w->add_float_data(1.5f);
  w->add_float_data(-0.5f);
  onnx::NodeProto* loop = graph->add_node();
  loop->set_op_type("Loop");
  loop->set_name("repeat");
  for (const char* in : {"trips", "", "x"})
    loop->add_input(in);
  loop->add_output("v_final");
  loop->add_output("v_each");
  onnx::AttributeProto* body_attr = loop->add_attribute();
  body_attr->set_name("body");
  body_attr->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* body = body_attr->mutable_g();
  body->add_input()->set_name("i");
  body->add_input()->set_name("cond_in");
  float_value(body->add_input(), "v_in");
  onnx::NodeProto* keep = body->add_node();
  keep->set_op_type("Identity");
  keep->add_input("cond_in");
  keep->add_output("cond_out");
  onnx::NodeProto* times = body->add_node();
  times->set_op_type("Mul");
  times->add_input("v_in");
  times->add_input("w");  // from the enclosing scope
  times->add_output("v_out");
  onnx::NodeProto* copy = body->add_node();
  copy->set_op_type("Identity");
  copy->add_input("v_out");
  copy->add_output("scan");
  for (const char* out : {"cond_out", "v_out", "scan"})
    body->add_output()->set_name(out);
  onnx::NodeProto* branch = graph->add_node();
  branch->set_op_type("If");
  branch->add_input("yes");
  branch->add_output("y");
  for (const char* name : {"then_branch", "else_branch"}) {
    onnx::AttributeProto* a = branch->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    onnx::NodeProto* pick = a->mutable_g()->add_node();
    pick->set_op_type(std::string(name) == "then_branch" ? "Identity" : "Neg");
    pick->add_input("v_final");
    pick->add_output("out");
    a->mutable_g()->add_output()->set_name("out");
  }
  float_value(graph->add_input(), "x");
  graph->add_output()->set_name("y");
  graph->add_output()->set_name("v_each");
  const std::string path = save_model(model, "onnx_control", "control.onnx");
  Tensor x = Tensor::from_floats({2}, std::vector<float>{2, 3}, cpu());
  for (Backend* device : backends()) {
    SCOPED_TRACE(device->name());
    nn::OnnxModel m(path, *device);
    ASSERT_EQ(m.parameters().size(), 1u);
    ag::Tape tape;
    std::vector<ag::Var> outs = m.run(tape, {x.to(*device)}, {true, 0});
    ASSERT_EQ(outs.size(), 2u);
    EXPECT_EQ(values(outs[0].value()), (std::vector<double>{2 * 3.375, 3 * -0.125}));
    EXPECT_EQ(outs[1].shape(), (Shape{3, 2}));
    EXPECT_EQ(values(outs[1].value()), (std::vector<double>{3, -1.5, 4.5, 0.75, 6.75, -0.375}));
    tape.backward(ag::sum(tape, outs[0]));
    EXPECT_EQ(values(m.parameters()[0].var.grad()),
              (std::vector<double>{2 * 3 * 2.25, 3 * 3 * 0.25}));
  }
  nn::OnnxModel m(path, cpu());
  EXPECT_FALSE(m.capturable());
  EXPECT_NE(m.capture_refusal().find("node 'repeat' (Loop) runs a subgraph"), std::string::npos)
      << m.capture_refusal();
  bool counted = false;
  for (const auto& use : m.coverage())
    counted = counted || (use.op == "Mul" && use.supported);  // the body's nodes count too
  EXPECT_TRUE(counted);
}

// An initializer stored beside the model (onnx's save_as_external_data, for models over
// protobuf's 2 GB) loads from its location, offset and length; a location outside the
// model's folder and a range past the file's end are refused by name.
TEST(Onnx, ExternalDataLoadsFromBesideTheModel) {
  const std::string dir = temp_dir("onnx_external");
  auto write_model = [&](const std::string& location, std::int64_t length) {
    onnx::ModelProto model;
    model.set_ir_version(8);
    model.add_opset_import()->set_version(13);
    onnx::GraphProto* graph = model.mutable_graph();
    onnx::NodeProto* mul = graph->add_node();
    mul->set_op_type("Mul");
    mul->add_input("x");
    mul->add_input("w");
    mul->add_output("y");
    onnx::TensorProto* w = graph->add_initializer();
    w->set_name("w");
    w->set_data_type(onnx::TensorProto_DataType_FLOAT);
    w->add_dims(3);
    w->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
    for (auto [key, value] : {std::pair<std::string, std::string>{"location", location},
                              {"offset", "8"},
                              {"length", std::to_string(length)}}) {
      onnx::StringStringEntryProto* e = w->add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
    onnx::ValueInfoProto* in = graph->add_input();
    in->set_name("x");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    graph->add_output()->set_name("y");
    const std::string path = dir + "/model.onnx";
    std::ofstream out(path, std::ios::binary);
    model.SerializeToOstream(&out);
    return path;
  };
  {
    std::ofstream data(dir + "/weights.bin", std::ios::binary);
    const float values[] = {0, 0, 2, 3, 4};  // 8 bytes before the tensor's 12
    data.write(reinterpret_cast<const char*>(values), sizeof values);
  }
  Tensor x = Tensor::from_floats({3}, std::vector<float>{1, 1, 2}, cpu());
  nn::OnnxModel m(write_model("weights.bin", 12), cpu());
  EXPECT_EQ(m.evaluate({x}).front().to_floats(), (std::vector<float>{2, 3, 8}));
  std::string message = error_of([&] { nn::OnnxModel(write_model("../weights.bin", 12), cpu()); });
  EXPECT_NE(message.find("must be a path inside the model's folder"), std::string::npos) << message;
  message = error_of([&] { nn::OnnxModel(write_model("weights.bin", 16), cpu()); });
  EXPECT_NE(message.find("runs past the end of"), std::string::npos) << message;
  message = error_of([&] { nn::OnnxModel(write_model("absent.bin", 12), cpu()); });
  EXPECT_NE(message.find("initializer 'w': external data file"), std::string::npos) << message;
}

// A model written for opset 4 (Reshape's shape as an attribute) is upgraded to opset 7 by
// ONNX's version converter as it is read, and runs.
TEST(Onnx, OldOpsetsAreUpgradedOnReading) {
  onnx::ModelProto model;
  model.set_ir_version(3);
  model.add_opset_import()->set_version(4);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* reshape = graph->add_node();
  reshape->set_op_type("Reshape");
  reshape->add_input("x");
  reshape->add_output("y");
  onnx::AttributeProto* shape = reshape->add_attribute();
  shape->set_name("shape");
  shape->set_type(onnx::AttributeProto::INTS);
  shape->add_ints(3);
  shape->add_ints(2);
  onnx::ValueInfoProto* in = graph->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  for (std::int64_t d : {2, 3})
    in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_old_opset", "reshape4.onnx");
  nn::OnnxModel m(path, cpu());
  EXPECT_EQ(m.graph().upgraded_from, 4);
  EXPECT_EQ(m.graph().opset, 7);
  Tensor x = Tensor::from_floats({2, 3}, std::vector<float>{0, 1, 2, 3, 4, 5}, cpu());
  Tensor y = m.evaluate({x}).front();
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_floats(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

// Einsum (a batched product), GroupNormalization and ScatterND with reduction add, chained:
// the gradient of every parameter against central finite differences on the CPU.
TEST(Onnx, EinsumGroupNormAndScatterGradientsMatchFiniteDifferences) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(21);
  onnx::GraphProto* graph = model.mutable_graph();
  auto node = [&](const char* op, std::vector<const char*> ins, const char* out) {
    onnx::NodeProto* nd = graph->add_node();
    nd->set_op_type(op);
    for (const char* in : ins)
      nd->add_input(in);
    nd->add_output(out);
    return nd;
  };
  onnx::AttributeProto* eq = node("Einsum", {"x", "w"}, "e")->add_attribute();
  eq->set_name("equation");
  eq->set_type(onnx::AttributeProto::STRING);
  eq->set_s("bij,bjk->bik");
  onnx::AttributeProto* groups =
      node("GroupNormalization", {"e", "scale", "bias"}, "g")->add_attribute();
  groups->set_name("num_groups");
  groups->set_type(onnx::AttributeProto::INT);
  groups->set_i(1);
  onnx::AttributeProto* reduction = node("ScatterND", {"g", "at", "u"}, "y")->add_attribute();
  reduction->set_name("reduction");
  reduction->set_type(onnx::AttributeProto::STRING);
  reduction->set_s("add");
  nn::Rng rng(29);
  auto floats = [&](const char* name, Shape shape) {
    onnx::TensorProto* t = graph->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_FLOAT);
    for (std::int64_t d : shape)
      t->add_dims(d);
    for (double v : values(random(shape, rng)))
      t->add_float_data(static_cast<float>(v));
  };
  floats("w", {2, 4, 3});
  floats("scale", {3});
  floats("bias", {3});
  floats("u", {2, 3});
  onnx::TensorProto* at = graph->add_initializer();  // rows [0, 1] twice: two rounds of add
  at->set_name("at");
  at->set_data_type(onnx::TensorProto_DataType_INT64);
  for (std::int64_t d : {2, 2})
    at->add_dims(d);
  for (std::int64_t v : {0, 1, 0, 1})
    at->add_int64_data(v);
  onnx::ValueInfoProto* in = graph->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  graph->add_output()->set_name("y");
  const std::string path = save_model(model, "onnx_einsum", "model.onnx");
  nn::OnnxModel m(path, cpu());
  ASSERT_EQ(m.parameters().size(), 4u);
  const Tensor x = random({2, 3, 4}, rng), probe = random({2, 3, 3}, rng);
  auto loss = [&](ag::Tape& tape) {
    return ag::sum(tape, ag::mul(tape, m.run(tape, {x}, {}).front(), ag::Var(probe)));
  };
  ag::Tape tape;
  tape.backward(loss(tape));
  for (nn::Parameter& p : m.parameters()) {
    SCOPED_TRACE(p.name);
    const std::vector<double> grad = values(p.var.grad());
    float* v = p.var.value().data<float>();
    for (std::size_t i = 0; i < grad.size(); ++i) {
      const float keep = v[i], h = 1e-2f;
      ag::Tape t1, t2;
      t1.set_recording(false);
      t2.set_recording(false);
      v[i] = keep + h;
      const double up = loss(t1).value().item();
      v[i] = keep - h;
      const double down = loss(t2).value().item();
      v[i] = keep;
      EXPECT_NEAR(grad[i], (up - down) / (2 * h), 2e-2 * std::max(1.0, std::fabs(grad[i]))) << i;
    }
  }
}

// A Loop whose condition never turns false and that has no trip count stops at the
// graph's limit of node executions with an error naming the node, never a hang; a Loop of
// zero trips gives an empty scan output shaped as its body declares.
TEST(Onnx, LoopsEndAndZeroTripsGiveEmptyScans) {
  auto write = [&](bool endless) {
    onnx::ModelProto model;
    model.set_ir_version(8);
    model.add_opset_import()->set_version(16);
    onnx::GraphProto* graph = model.mutable_graph();
    onnx::TensorProto* trips = graph->add_initializer();
    trips->set_name("trips");
    trips->set_data_type(onnx::TensorProto_DataType_INT64);
    trips->add_int64_data(0);
    onnx::TensorProto* yes = graph->add_initializer();
    yes->set_name("yes");
    yes->set_data_type(onnx::TensorProto_DataType_BOOL);
    yes->add_int32_data(1);
    onnx::NodeProto* loop = graph->add_node();
    loop->set_op_type("Loop");
    loop->set_name("spin");
    loop->add_input(endless ? "" : "trips");
    loop->add_input("yes");
    loop->add_input("x");
    loop->add_output("v");
    loop->add_output("each");
    onnx::AttributeProto* a = loop->add_attribute();
    a->set_name("body");
    a->set_type(onnx::AttributeProto::GRAPH);
    onnx::GraphProto* body = a->mutable_g();
    for (const char* in : {"i", "c", "v_in"})
      body->add_input()->set_name(in);
    onnx::NodeProto* keep = body->add_node();
    keep->set_op_type("Identity");
    keep->add_input("c");
    keep->add_output("c_out");
    onnx::NodeProto* neg = body->add_node();
    neg->set_op_type("Neg");
    neg->add_input("v_in");
    neg->add_output("v_out");
    onnx::NodeProto* copy = body->add_node();
    copy->set_op_type("Identity");
    copy->add_input("v_out");
    copy->add_output("e");
    body->add_output()->set_name("c_out");
    body->add_output()->set_name("v_out");
    onnx::ValueInfoProto* e = body->add_output();
    e->set_name("e");
    e->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    e->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(2);
    onnx::ValueInfoProto* in = graph->add_input();
    in->set_name("x");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    graph->add_output()->set_name("v");
    graph->add_output()->set_name("each");
    std::string path = temp_dir(endless ? "onnx_endless" : "onnx_zero_trips") + "/loop.onnx";
    std::ofstream out(path, std::ios::binary);
    model.SerializeToOstream(&out);
    return path;
  };
  Tensor x = Tensor::from_floats({2}, std::vector<float>{1, 2}, cpu());
  std::vector<Tensor> outs = nn::OnnxModel(write(false), cpu()).evaluate({x});
  EXPECT_EQ(outs[0].to_floats(), (std::vector<float>{1, 2}));
  EXPECT_EQ(outs[1].shape(), (Shape{0, 2}));
  nn::OnnxModel endless(write(true), cpu());
  endless.set_node_limit(3000);  // the default, 2^22, takes seconds to reach here
  const std::string message = error_of([&] { endless.evaluate({x}); });
  EXPECT_NE(message.find("node 'spin' (Loop) attribute 'body'"), std::string::npos) << message;
  EXPECT_NE(message.find("ran more than 3000 nodes"), std::string::npos) << message;
}

// Pow of an integer base: an integer exponent by checked products ((2)^-1 = 0, as integer
// pow), a float one by double pow truncated toward zero (3^0.5 = 1), as ONNX Runtime.
TEST(Onnx, IntegerPowIsComputedOnTheHost) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(15);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* pow = graph->add_node();
  pow->set_op_type("Pow");
  pow->add_input("x");
  pow->add_input("e");
  pow->add_output("y");
  onnx::NodeProto* pow_int = graph->add_node();
  pow_int->set_op_type("Pow");
  pow_int->add_input("x");
  pow_int->add_input("k");
  pow_int->add_output("z");
  onnx::TensorProto* x = graph->add_initializer();
  x->set_name("x");
  x->set_data_type(onnx::TensorProto_DataType_INT64);
  x->add_dims(3);
  for (std::int64_t v : {1, 3, 2})
    x->add_int64_data(v);
  onnx::TensorProto* k = graph->add_initializer();
  k->set_name("k");
  k->set_data_type(onnx::TensorProto_DataType_INT64);
  k->add_int64_data(-1);
  onnx::ValueInfoProto* in = graph->add_input();
  in->set_name("e");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  graph->add_output()->set_name("y");
  graph->add_output()->set_name("z");
  const std::string path = save_model(model, "onnx_int_pow", "pow.onnx");
  Tensor e = Tensor::from_floats({3}, std::vector<float>{4, 0.5f, 5}, cpu());
  std::vector<Tensor> outs = nn::OnnxModel(path, cpu()).evaluate({e});
  auto ints = [](const Tensor& t) {
    EXPECT_EQ(t.dtype(), DType::i64);
    const std::int64_t* p = t.data<std::int64_t>();
    return std::vector<std::int64_t>(p, p + t.numel());
  };
  EXPECT_EQ(ints(outs[0]), (std::vector<std::int64_t>{1, 1, 32}));
  EXPECT_EQ(ints(outs[1]), (std::vector<std::int64_t>{1, 0, 0}));
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
  const std::string path = save_model(model, "onnx_cast", "cast.onnx");
  EXPECT_FALSE(nn::OnnxModel(path, cpu()).capturable());
}

TEST(Onnx, CoverageNamesTheOpsLoomLacksAndRunningStopsAtTheFirst) {
  nn::OnnxModel model(write_unsupported_model(temp_dir("onnx_unsupported")), cpu());
  ASSERT_EQ(model.coverage().size(), 1u);
  EXPECT_EQ(model.coverage()[0].op, "STFT");
  EXPECT_FALSE(model.coverage()[0].supported);
  nn::Rng rng(2);
  ag::Tape tape;
  std::string message = error_of([&] { model.forward(tape, random({3}, rng), {}); });
  EXPECT_NE(message.find("stft.onnx: node 'stft' (STFT)"), std::string::npos) << message;
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

// ---- hostile files: a named error, never a crash ------------------------------------

void save(const google::protobuf::MessageLite& message, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  message.SerializeToOstream(&out);
}

// Tensor files whose shape promises more than the data holds: the data was allocated
// from the shape before its size was checked ([2^40,4]: 16 TiB, bad_alloc), or the
// shape's element count wrapped to 0 ([2^32,2^32]) and an empty tensor of that shape
// came back over no storage.
TEST(Onnx, TensorShapesAreCheckedBeforeAnyAllocation) {
  std::string dir = temp_dir("onnx_tensor_sizes");
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto_DataType_FLOAT);
  t.add_dims(std::int64_t{1} << 40);
  t.add_dims(4);
  t.set_raw_data(std::string(16, '\0'));
  save(t, dir + "/huge_raw.pb");
  std::string message = error_of([&] { io::read_onnx_tensor(dir + "/huge_raw.pb", cpu()); });
  EXPECT_NE(message.find("huge_raw.pb: raw_data holds 16 bytes, the shape [1099511627776,4] "
                         "needs 4398046511104 values of 4 bytes"),
            std::string::npos)
      << message;
  t.clear_raw_data();
  for (int i = 0; i < 4; ++i)
    t.add_float_data(0.0f);
  save(t, dir + "/huge_typed.pb");
  message = error_of([&] { io::read_onnx_tensor(dir + "/huge_typed.pb", cpu()); });
  EXPECT_NE(message.find("huge_typed.pb: holds 4 values, the shape [1099511627776,4] needs "
                         "4398046511104"),
            std::string::npos)
      << message;
  onnx::TensorProto wrap;
  wrap.set_data_type(onnx::TensorProto_DataType_FLOAT);
  wrap.add_dims(std::int64_t{1} << 32);
  wrap.add_dims(std::int64_t{1} << 32);
  save(wrap, dir + "/wrap.pb");
  message = error_of([&] { io::read_onnx_tensor(dir + "/wrap.pb", cpu()); });
  EXPECT_NE(message.find("wrap.pb: the element count of shape [4294967296,4294967296] "
                         "overflows int64"),
            std::string::npos)
      << message;
}

// A model built in the test, node by node (each hostile one is also kept under
// tests/fixtures/fuzz/onnx_model).
class GraphBuilder {
 public:
  GraphBuilder() {
    model_.set_ir_version(7);
    model_.add_opset_import()->set_version(14);
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> inputs,
                        std::vector<std::string> outputs) {
    onnx::NodeProto* n = graph()->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(graph()->node_size()));
    for (const std::string& in : inputs)
      n->add_input(in);
    for (const std::string& out : outputs)
      n->add_output(out);
    return n;
  }
  // A float input of `dims` (none: no declared shape).
  void input(const std::string& name, std::vector<std::int64_t> dims) {
    onnx::ValueInfoProto* v = graph()->add_input();
    v->set_name(name);
    auto* type = v->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    if (!dims.empty())
      for (std::int64_t d : dims)
        type->mutable_shape()->add_dim()->set_dim_value(d);
  }
  void output(const std::string& name) { graph()->add_output()->set_name(name); }
  void int64s(const std::string& name, std::vector<std::int64_t> values) {
    onnx::TensorProto* t = graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto_DataType_INT64);
    t->add_dims(static_cast<std::int64_t>(values.size()));
    for (std::int64_t v : values)
      t->add_int64_data(v);
  }
  static void ints(onnx::NodeProto* n, const std::string& name, std::vector<std::int64_t> values) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (std::int64_t v : values)
      a->add_ints(v);
  }
  static void integer(onnx::NodeProto* n, const std::string& name, std::int64_t value) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }
  std::string save_as(const std::string& path) {
    save(model_, path);
    return path;
  }

 private:
  onnx::GraphProto* graph() { return model_.mutable_graph(); }
  onnx::ModelProto model_;
};

// Random inputs of the shapes the graph declares (undeclared dimensions: 1).
std::vector<Tensor> declared_inputs(const nn::OnnxModel& model) {
  nn::Rng rng(4);
  std::vector<Tensor> inputs;
  for (const io::OnnxValueInfo& in : model.graph().inputs) {
    Shape shape;
    for (std::int64_t d : in.shape)
      shape.push_back(d < 0 ? 1 : d);
    if (in.dtype == DType::f32) {
      inputs.push_back(random(shape, rng));
    } else {
      std::vector<std::int64_t> zeros(static_cast<std::size_t>(shape_numel(shape)), 0);
      inputs.push_back(Tensor::from_host(shape, in.dtype == DType::u8 ? DType::u8 : DType::i64,
                                         zeros.data(), cpu()));
    }
  }
  return inputs;
}

// The loom::Error of loading `path` and evaluating it on declared_inputs.
std::string run_error(const std::string& path) {
  return error_of([&] {
    nn::OnnxModel model(path, cpu());
    model.evaluate(declared_inputs(model));
  });
}

TEST(Onnx, MalformedGraphsGetNamedErrors) {
  std::string dir = temp_dir("onnx_malformed");
  auto expect_run_error = [&](const std::string& path, const std::string& needle) {
    std::string message = run_error(path);
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  {  // Slice with fewer steps than axes: steps[1] was read past the end.
    GraphBuilder g;
    g.input("x", {2, 2});
    g.int64s("starts", {0, 0});
    g.int64s("ends", {1, 1});
    g.int64s("axes", {0, 1});
    g.int64s("steps", {1});
    g.node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"});
    g.output("y");
    expect_run_error(g.save_as(dir + "/slice_short_steps.onnx"),
                     "node 'Slice_1' (Slice): steps has 1 entries for 2 axes");
  }
  {  // A Shape node without an output: its value was stored through outputs[0].
    GraphBuilder g;
    g.input("x", {2, 3});
    g.node("Shape", {"x"}, {});
    g.node("Relu", {"x"}, {"y"});
    g.output("y");
    expect_run_error(g.save_as(dir + "/shape_no_output.onnx"),
                     "node 'Shape_1' (Shape): has no output 0");
  }
  {  // Identity without an output: std::out_of_range, an "internal error".
    GraphBuilder g;
    g.input("x", {2});
    g.node("Identity", {"x"}, {});
    g.node("Relu", {"x"}, {"y"});
    g.output("y");
    expect_run_error(g.save_as(dir + "/identity_no_output.onnx"),
                     "node 'Identity_1' (Identity): has no output 0");
  }
  {  // Unsqueeze with a repeated axis: std::out_of_range.
    GraphBuilder g;
    g.input("x", {2, 3});
    g.int64s("axes", {0, 0});
    g.node("Unsqueeze", {"x", "axes"}, {"y"});
    g.output("y");
    expect_run_error(g.save_as(dir + "/unsqueeze_repeated_axis.onnx"),
                     "node 'Unsqueeze_1' (Unsqueeze): axis 0 appears twice in axes [0,0]");
  }
  {  // INT64_MIN / -1 on the host: SIGFPE.
    GraphBuilder g;
    g.int64s("a", {std::numeric_limits<std::int64_t>::min()});
    g.int64s("b", {-1});
    g.node("Div", {"a", "b"}, {"q"});
    g.output("q");
    expect_run_error(g.save_as(dir + "/div_int64_min.onnx"),
                     "node 'Div_1' (Div): integer Div of -9223372036854775808 and -1 overflows "
                     "int64");
  }
  {  // INT64_MAX * 2 on the host: a silent wrap (undefined behaviour).
    GraphBuilder g;
    g.int64s("a", {std::numeric_limits<std::int64_t>::max()});
    g.int64s("b", {2});
    g.node("Mul", {"a", "b"}, {"p"});
    g.output("p");
    expect_run_error(g.save_as(dir + "/mul_overflow.onnx"),
                     "integer Mul of 9223372036854775807 and 2 overflows int64");
  }
  for (const char* op : {"Add", "Sub"}) {  // INT64_MAX + 1, INT64_MIN - 1: the same wrap
    GraphBuilder g;
    const bool add = std::string(op) == "Add";
    g.int64s("a", {add ? std::numeric_limits<std::int64_t>::max()
                       : std::numeric_limits<std::int64_t>::min()});
    g.int64s("b", {1});
    g.node(op, {"a", "b"}, {"p"});
    g.output("p");
    expect_run_error(g.save_as(dir + "/" + op + "_overflow.onnx"),
                     std::string("integer ") + op + " of " +
                         (add ? "9223372036854775807" : "-9223372036854775808") +
                         " and 1 overflows int64");
  }
  {  // MaxPool with ceil_mode and stride 0: SIGFPE before any stride check.
    GraphBuilder g;
    g.input("x", {1, 1, 4, 4});
    onnx::NodeProto* n = g.node("MaxPool", {"x"}, {"y"});
    GraphBuilder::ints(n, "kernel_shape", {2, 2});
    GraphBuilder::ints(n, "strides", {0, 0});
    GraphBuilder::integer(n, "ceil_mode", 1);
    g.output("y");
    expect_run_error(g.save_as(dir + "/maxpool_stride_zero.onnx"),
                     "node 'MaxPool_1' (MaxPool): strides [0,0] must be > 0");
  }
  {  // A kernel of 0.
    GraphBuilder g;
    g.input("x", {1, 1, 4, 4});
    onnx::NodeProto* n = g.node("AveragePool", {"x"}, {"y"});
    GraphBuilder::ints(n, "kernel_shape", {0, 0});
    g.output("y");
    expect_run_error(g.save_as(dir + "/avgpool_kernel_zero.onnx"),
                     "node 'AveragePool_1' (AveragePool): kernel_shape [0,0] must be > 0");
  }
  {  // Pads of 2^40: a padding block of 2^42 floats was allocated (bad_alloc).
    GraphBuilder g;
    g.input("x", {1, 1, 4, 4});
    onnx::NodeProto* n = g.node("MaxPool", {"x"}, {"y"});
    GraphBuilder::ints(n, "kernel_shape", {2, 2});
    GraphBuilder::ints(n, "pads", {std::int64_t{1} << 40, 0, 0, 0});
    g.output("y");
    expect_run_error(g.save_as(dir + "/pads_huge.onnx"),
                     "node 'MaxPool_1' (MaxPool): pads [1099511627776,0,0,0] must be in 0..4096");
  }
  {  // Negative pads were silently ignored.
    GraphBuilder g;
    g.input("x", {1, 1, 4, 4});
    g.input("w", {1, 1, 3, 3});
    onnx::NodeProto* n = g.node("Conv", {"x", "w"}, {"y"});
    GraphBuilder::ints(n, "pads", {-1, 0, 1, 0});
    g.output("y");
    expect_run_error(g.save_as(dir + "/pads_negative.onnx"),
                     "node 'Conv_1' (Conv): pads [-1,0,1,0] must be in 0..4096");
  }
  {  // A Reshape target whose product overflows.
    GraphBuilder g;
    g.input("x", {2, 2});
    g.int64s("shape", {std::int64_t{1} << 32, std::int64_t{1} << 32, -1});
    g.node("Reshape", {"x", "shape"}, {"y"});
    g.output("y");
    expect_run_error(g.save_as(dir + "/reshape_overflow.onnx"),
                     "node 'Reshape_1' (Reshape): target shape [4294967296,4294967296,-1]");
  }
  {  // An initializer whose raw data is far smaller than its shape: fails while loading.
    onnx::ModelProto model;
    model.set_ir_version(7);
    model.add_opset_import()->set_version(14);
    onnx::TensorProto* t = model.mutable_graph()->add_initializer();
    t->set_name("w");
    t->set_data_type(onnx::TensorProto_DataType_FLOAT);
    t->add_dims(std::int64_t{1} << 40);
    t->add_dims(4);
    t->set_raw_data(std::string(16, '\0'));
    model.mutable_graph()->add_output()->set_name("w");
    save(model, dir + "/initializer_huge.onnx");
    expect_run_error(dir + "/initializer_huge.onnx",
                     "initializer 'w': raw_data holds 16 bytes, the shape [1099511627776,4] needs");
  }
}

TEST(Onnx, AZeroLastDimensionGivesEmptyRows) {
  // forward() folds [B,T,V] logits into rows by dividing the element count by V: SIGFPE
  // when V is 0.
  std::string dir = temp_dir("onnx_zero_dim");
  GraphBuilder g;
  g.input("x", {});
  g.node("Relu", {"x"}, {"y"});
  g.output("y");
  nn::OnnxModel model(g.save_as(dir + "/relu.onnx"), cpu());
  nn::Rng rng(1);
  ag::Tape tape;
  EXPECT_EQ(model.forward(tape, random({2, 3, 0}, rng), {}).shape(), (Shape{6, 0}));
}

TEST(Onnx, BackendTestsFailAnOutputThatMissesAnExpectedInfinity) {
  // |got - inf| <= atol + rtol * |inf| is inf <= inf: a finite output passed against +inf.
  std::string dir = temp_dir("onnx_inf");
  int case_number = 0;
  for (float got : {1.0f, -INFINITY, INFINITY}) {
    const std::string folder = dir + "/test_identity_" + std::to_string(case_number++);
    std::filesystem::create_directories(folder + "/test_data_set_0");
    GraphBuilder g;
    g.input("x", {1});
    g.node("Identity", {"x"}, {"y"});
    g.output("y");
    g.save_as(folder + "/model.onnx");
    onnx::TensorProto x, y;
    for (onnx::TensorProto* t : {&x, &y}) {
      t->set_data_type(onnx::TensorProto_DataType_FLOAT);
      t->add_dims(1);
    }
    x.add_float_data(got);
    y.add_float_data(INFINITY);
    save(x, folder + "/test_data_set_0/input_0.pb");
    save(y, folder + "/test_data_set_0/output_0.pb");
    nn::OnnxTestResult r = nn::run_onnx_backend_test(folder, cpu());
    EXPECT_EQ(r.status, got == INFINITY ? "pass" : "fail") << got << ": " << r.detail;
  }
}

// Every hostile file kept in tests/fixtures/fuzz: tensors read, models loaded and run on
// inputs of their declared shapes, each gives a loom::Error naming the file.
TEST(Onnx, FuzzFixturesGiveNamedErrors) {
  std::vector<std::string> tensors = fuzz_inputs("onnx_tensor");
  EXPECT_FALSE(tensors.empty());
  for (const std::string& path : tensors) {
    std::string message = error_of([&] { io::read_onnx_tensor(path, cpu()); });
    EXPECT_NE(message.find(path), std::string::npos) << path << ": " << message;
  }
  std::vector<std::string> models = fuzz_inputs("onnx_model");
  EXPECT_FALSE(models.empty());
  for (const std::string& path : models) {
    // A finding on valid input (integer arithmetic with an empty operand) runs; any error
    // names the file.
    std::string message = run_error(path);
    EXPECT_TRUE(message.empty() || message.find(path) != std::string::npos)
        << path << ": " << message;
  }
}

}  // namespace
}  // namespace loom::testing
