// cli/engine/onnx_command — `loom onnx MODEL`: what an ONNX model needs from Loom, and running it.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace loom::cli {

struct OnnxOptions {
  std::string model;
  std::vector<std::string> inputs;  // TensorProto files, one per graph input
  std::vector<std::string> expect;  // TensorProto files, one per graph output
  std::string device = "cpu";
  double rtol = 1e-4, atol = 1e-5;
  bool json = false;
  bool nodes = false;  // list every node
  // A folder of ONNX backend tests (test_*/model.onnx + test_data_set_0/*.pb): run each.
  std::string conformance;
  bool verbose = false;  // with conformance: a line for every test, not only the failures
};

CLI::App* add_onnx_command(CLI::App& app, OnnxOptions& options);
int run_onnx(const OnnxOptions& options);

}  // namespace loom::cli
