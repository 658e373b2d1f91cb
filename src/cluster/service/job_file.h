// cluster/service/job_file.h — a job file as `loom fleet submit` reads it: YAML, with the
// job's fields and its training config inline (`config:`) or in a file of its own
// (`config_file:`), turned into the JSON request the service takes (job_spec.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace YAML {
class Node;
}

namespace loom::service {

// A YAML node as JSON: quoted scalars stay strings; plain ones become numbers or
// booleans where they read as such. `where` names the node in errors.
nlohmann::json json_of(const YAML::Node& node, const std::string& where);

// The job at `path`. Files its config names (keys with the job contract's kPath role:
// data, onnx, init, mnist_dir) become absolute paths where they exist, so the job finds
// them wherever the service runs it. Throws loom::Error naming the file and field.
nlohmann::json read_job_file(const std::string& path);

}  // namespace loom::service
