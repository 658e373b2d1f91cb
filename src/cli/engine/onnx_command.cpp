#include "cli/engine/onnx_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dispatch/devices.h"
#include "onnx/model.h"
#include "onnx/parser.h"

namespace loom::cli {

CLI::App* add_onnx_command(CLI::App& app, OnnxOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "onnx", "an ONNX model: its operators and which Loom runs; with --input, run it");
  cmd->add_option("model", options.model, "the .onnx file");
  cmd->add_option("--conformance", options.conformance,
                  "a folder of ONNX backend tests (test_*/model.onnx, test_data_set_0/*.pb): "
                  "run every test, print a line per failure and a summary");
  cmd->add_flag("--verbose", options.verbose, "with --conformance: a line for every test");
  cmd->add_option("--input", options.inputs, "a TensorProto (.pb) per graph input, in order");
  cmd->add_option("--expect", options.expect,
                  "a TensorProto (.pb) per graph output: compare, exit 1 when outside tolerance");
  cmd->add_option("--device", options.device, "backend to run on (cpu, partial, opencl, cuda)");
  cmd->add_option("--rtol", options.rtol, "relative tolerance for --expect");
  cmd->add_option("--atol", options.atol, "absolute tolerance for --expect");
  cmd->add_flag("--json", options.json, "print one JSON object");
  cmd->add_flag("--nodes", options.nodes, "list every node: op, inputs -> outputs, attributes");
  return cmd;
}

namespace {

int run_conformance(const OnnxOptions& options, Backend& device) {
  std::error_code ec;
  check(std::filesystem::is_directory(options.conformance, ec),
        options.conformance +
            ": not a folder (expected ONNX backend test folders, test_*/model.onnx)");
  std::vector<std::filesystem::path> tests;
  for (const auto& entry : std::filesystem::directory_iterator(options.conformance))
    if (std::filesystem::exists(entry.path() / "model.onnx", ec))
      tests.push_back(entry.path());
  std::sort(tests.begin(), tests.end());
  check(!tests.empty(), options.conformance + ": no test folders with a model.onnx");
  std::map<std::string, int> tally;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const auto& dir : tests) {
    nn::OnnxTestResult r = nn::run_onnx_backend_test(dir.string(), device);
    ++tally[r.status];
    results.push_back({{"test", r.test}, {"status", r.status}, {"detail", r.detail}});
    if (!options.json && (options.verbose || r.status == "fail" || r.status == "error"))
      std::printf("%-60s %-11s %s\n", r.test.c_str(), r.status.c_str(), r.detail.c_str());
  }
  if (options.json) {
    std::printf("%s\n", nlohmann::ordered_json{{"folder", options.conformance},
                                               {"tests", tests.size()},
                                               {"pass", tally["pass"]},
                                               {"fail", tally["fail"]},
                                               {"error", tally["error"]},
                                               {"unsupported", tally["unsupported"]},
                                               {"random", tally["random"]},
                                               {"results", results}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "%zu tests on %s: %d pass, %d fail, %d error, %d use an op Loom does not import, %d "
        "compare against numpy's random draws\n",
        tests.size(), std::string(device.name()).c_str(), tally["pass"], tally["fail"],
        tally["error"], tally["unsupported"], tally["random"]);
  }
  return tally["fail"] + tally["error"] > 0 ? 1 : 0;
}

// --nodes: one line per node, "Op (name): inputs -> outputs attributes".
std::string describe_node(const io::OnnxNode& node) {
  std::string line = node.op_type + " (" + node.name + "):";
  for (const std::string& in : node.inputs)
    line += " " + (in.empty() ? std::string("-") : in);
  line += " ->";
  for (const std::string& out : node.outputs)
    line += " " + out;
  for (const auto& [name, a] : node.attributes) {
    line += " " + name + "=";
    using K = io::OnnxAttribute::Kind;
    if (a.kind == K::i)
      line += std::to_string(a.i);
    else if (a.kind == K::f)
      line += std::to_string(a.f);
    else if (a.kind == K::s)
      line += a.s;
    else if (a.kind == K::t)
      line += a.t.describe();
    else if (a.kind == K::ints)
      line += shape_str(a.ints);
    else
      line += "(...)";
  }
  return line;
}

// What the model is and which of its ops Loom imports (printed unless --json).
nlohmann::ordered_json describe_model(const OnnxOptions& options, nn::OnnxModel& model) {
  const io::OnnxGraph& g = model.graph();
  nlohmann::ordered_json report{
      {"model", options.model}, {"producer", g.producer},  {"ir_version", g.ir_version},
      {"opset", g.opset},       {"nodes", g.nodes.size()}, {"parameters", model.parameter_count()}};
  if (g.upgraded_from > 0)
    report["upgraded_from_opset"] = g.upgraded_from;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int type : g.element_types)
    types.push_back({{"type", io::onnx_type_name(type)}, {"held_as", io::onnx_type_held_as(type)}});
  report["element_types"] = types;
  int unsupported = 0;
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (const auto& use : model.coverage()) {
    ops.push_back({{"op", use.op}, {"count", use.count}, {"supported", use.supported}});
    unsupported += use.supported ? 0 : 1;
  }
  report["ops"] = ops;
  if (options.json)
    return report;
  const std::string upgraded =
      g.upgraded_from > 0 ? " (upgraded from opset " + std::to_string(g.upgraded_from) + ")" : "";
  std::printf("%s: %s, IR %lld, opset %lld%s, %zu nodes, %lld parameters\n", options.model.c_str(),
              g.producer.c_str(), static_cast<long long>(g.ir_version),
              static_cast<long long>(g.opset), upgraded.c_str(), g.nodes.size(),
              static_cast<long long>(model.parameter_count()));
  std::printf("element types: %s\n", io::describe_element_types(g).c_str());
  std::printf("%-22s %6s  %s\n", "ONNX op", "nodes", "Loom");
  for (const auto& use : model.coverage())
    std::printf("%-22s %6d  %s\n", use.op.c_str(), use.count,
                use.supported ? "imported" : "not supported yet");
  std::printf("%d of %zu op types not supported\n", unsupported, model.coverage().size());
  if (options.nodes)
    for (const io::OnnxNode& node : g.nodes)
      std::printf("  %s\n", describe_node(node).c_str());
  return report;
}

// --input: the model on the given inputs, each output compared with --expect's when given.
// Returns 1 when an output is outside the tolerance.
int run_on_inputs(const OnnxOptions& options, nn::OnnxModel& model,
                  nlohmann::ordered_json& report) {
  const io::OnnxGraph& g = model.graph();
  Backend& host = dispatch::device("cpu");
  std::vector<Tensor> inputs;
  for (const std::string& path : options.inputs)
    inputs.push_back(io::read_onnx_tensor(path, host));
  autograd::Tape tape;
  tape.set_recording(false);
  std::vector<autograd::Var> outputs = model.run(tape, inputs, {});
  check(options.expect.empty() || options.expect.size() == outputs.size(),
        std::to_string(options.expect.size()) + " --expect files for " +
            std::to_string(outputs.size()) + " graph outputs");
  int status = 0;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& y = outputs[i].value();
    nlohmann::ordered_json r{{"output", g.outputs[i].name}, {"shape", y.shape()}};
    std::string line = g.outputs[i].name + ": " + y.describe();
    if (!options.expect.empty()) {
      Tensor want = io::read_onnx_tensor(options.expect[i], host);
      check(want.shape() == y.shape(), options.expect[i] + ": expected shape " +
                                           shape_str(want.shape()) + ", the model gives " +
                                           shape_str(y.shape()));
      const nn::OutputError e = nn::output_error(y, want, options.atol, options.rtol);
      status = e.within_tolerance ? status : 1;
      r["max_abs_error"] = e.max_abs;
      r["within_tolerance"] = e.within_tolerance;
      char error[32];
      std::snprintf(error, sizeof error, "%.3g", e.max_abs);
      line += std::string(", max |error| ") + error + " against " + options.expect[i] + ": " +
              (e.within_tolerance ? "within tolerance" : "OUTSIDE TOLERANCE");
    }
    results.push_back(r);
    if (!options.json)
      std::printf("%s\n", line.c_str());
  }
  report["outputs"] = results;
  return status;
}

}  // namespace

int run_onnx(const OnnxOptions& options) {
  Backend& device = dispatch::device(options.device);
  if (!options.conformance.empty())
    return run_conformance(options, device);
  check(!options.model.empty(), "loom onnx: give a MODEL.onnx or --conformance DIR");
  nn::OnnxModel model(options.model, device);
  nlohmann::ordered_json report = describe_model(options, model);
  const int status = options.inputs.empty() ? 0 : run_on_inputs(options, model, report);
  if (options.json)
    std::printf("%s\n", report.dump().c_str());
  return status;
}

}  // namespace loom::cli
