// Reader: service::JobSpec::from_json -- the fleet service's parser of a POST /api/jobs
// body -- on the path the HTTP API takes (http_api.cpp): the bytes are parsed as JSON
// (invalid JSON is answered 400 before the parser sees it), then JobSpec::from_json.
// BadRequest (and loom::Error) are expected outcomes; a BadRequest is turned into the
// API's answer, {"error": MESSAGE} serialised, as the API does.
//
// An accepted job then goes where the service takes it: stored as to_json().dump() and
// read back at start-up with from_json (store.cpp) -- which must accept it again, or the
// service could not reopen its own store: the harness aborts then --, its model key and
// step count computed, and its config written as the YAML file the job's `loom train`
// reads (TrainConfig::load_yaml + finalize).
// Regressions: tests/fixtures/fuzz/job_spec/ (the request body as it is; that folder has
// no replay test yet -- see fuzz/README.md).
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "cluster/service/job_spec.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json body =
      nlohmann::json::parse(data, data + size, /*callback=*/nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    return 0;  // the API answers 400 "not valid JSON"
  try {
    const loom::service::JobSpec spec = loom::service::JobSpec::from_json(body, "job");
    const std::string stored = spec.to_json().dump();
    try {
      (void)loom::service::JobSpec::from_json(nlohmann::json::parse(stored), "stored job",
                                              loom::service::JobSpec::Origin::stored);
    } catch (const loom::service::BadRequest& again) {
      std::fprintf(stderr,
                   "FINDING: an accepted job does not read back from its stored form\n"
                   "  stored: %s\n  error: %s\n",
                   stored.c_str(), again.what());
      std::abort();
    }
    (void)spec.model_key();
    (void)spec.total_steps();
    const std::string config = loom::fuzz::write_scratch("config.yaml", spec.config_yaml());
    loom::train::TrainConfig train;
    train.load_yaml(config);
    train.finalize();
  } catch (const loom::service::BadRequest& bad) {
    (void)nlohmann::json{{"error", bad.what()}}.dump();  // http_api.cpp: refuse() -> reply()
  } catch (const loom::Error&) {
  }
  return 0;
}
