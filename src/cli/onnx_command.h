// cli/onnx_command — `loom onnx MODEL`: what an ONNX model needs from Loom, and running it.
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
};

CLI::App* add_onnx_command(CLI::App& app, OnnxOptions& options);
int run_onnx(const OnnxOptions& options);

}  // namespace loom::cli
