// core/job_contract.h — what a training job is, read by both halves of Loom: `loom train`
// (train/config.h) and the fleet service (cluster/service/job_spec.h). The keys come from
// one list, core/job_contract.def (type, default per model kind, range, role, help); the
// exit codes of `loom train` and `loom ops` are here too. Header-only and built on
// core/error.h alone, so the planning column may include it (scripts/check-floors names
// it as the column's one exception besides core's errors and checked arithmetic).
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "core/error.h"

// The C++ type of each key type of job_contract.def (TrainConfig's members).
#define LOOM_CONTRACT_CXX_INT std::int64_t
#define LOOM_CONTRACT_CXX_REAL double
#define LOOM_CONTRACT_CXX_BOOL bool
#define LOOM_CONTRACT_CXX_TEXT std::string
// A key's default as the text `loom train` parses: a TEXT literal as it is, others spelled.
#define LOOM_CONTRACT_BASE_INT(value) #value
#define LOOM_CONTRACT_BASE_REAL(value) #value
#define LOOM_CONTRACT_BASE_BOOL(value) #value
#define LOOM_CONTRACT_BASE_TEXT(value) value
#define LOOM_CONTRACT_KIND_INT ::loom::contract::KeyType::integer
#define LOOM_CONTRACT_KIND_REAL ::loom::contract::KeyType::real
#define LOOM_CONTRACT_KIND_BOOL ::loom::contract::KeyType::boolean
#define LOOM_CONTRACT_KIND_TEXT ::loom::contract::KeyType::text

namespace loom::contract {

// Exit statuses of `loom train` and `loom ops` (and every other `loom` command): what a
// scheduler needs to tell apart. 100-127 are CLI11's usage errors; 128 + N is signal N.
enum class ExitCode : int {
  ok = 0,
  error = 1,                // bad input or a failed run: the message says which (loom: error:)
  internal = 2,             // an exception Loom did not expect (loom: internal error:)
  device_unavailable = 69,  // the device asked for is not built in or not on this host
                            // (sysexits' EX_UNAVAILABLE): loom::DeviceUnavailable
  preempted = 75,           // stopped by SIGTERM/SIGINT at a step boundary with a checkpoint:
                            // resumable (sysexits' EX_TEMPFAIL)
  not_started = 127,        // the command could not be run at all (exec failed)
};
constexpr int code(ExitCode c) {
  return static_cast<int>(c);
}

// The records a run leaves for whoever schedules it, by field name: what `loom train` and
// `loom ops --json` write and the fleet service reads.
namespace record {
// OUT/metrics.jsonl: one line per step {step (1-based), loss, lr, ms}; lines of evaluation
// have no loss of a step. The service reads progress, step times and the loss curve.
inline constexpr const char* kStep = "step";
inline constexpr const char* kLoss = "loss";
inline constexpr const char* kLearningRate = "lr";
inline constexpr const char* kStepMs = "ms";
// `loom ops --json`, one object per backend: {schema_version, backend, ops: {op: {path,
// ...}}, step_s, launches_per_step, transformer: the model's shape}. A report of another
// schema version is not read.
inline constexpr int kOpsSchemaVersion = 1;
inline constexpr const char* kSchemaVersion = "schema_version";
inline constexpr const char* kOps = "ops";
inline constexpr const char* kOpPath = "path";  // native | decomposed | fallback
inline constexpr const char* kStepSeconds = "step_s";
inline constexpr const char* kLaunchesPerStep = "launches_per_step";
inline constexpr const char* kTransformer = "transformer";
// The transformer's shape, as the planner's performance model reads it (the service prices
// a chip's step with it): layers, hidden width, heads, FFN width, vocabulary, sequence,
// batch, and the precision of the matmul products.
inline constexpr const char* kLayers = "layers";
inline constexpr const char* kHidden = "hidden";
inline constexpr const char* kHeads = "heads";
inline constexpr const char* kFfn = "ffn";
inline constexpr const char* kVocab = "vocab";
inline constexpr const char* kSeq = "seq";
inline constexpr const char* kBatch = "batch";
inline constexpr const char* kPrecision = "precision";
}  // namespace record

enum class KeyType { integer, real, boolean, text };

// What a key is for, beyond training (roles of job_contract.def; | joins them).
enum Role : unsigned {
  kNone = 0,
  kSpeed = 1u << 0,     // decides the step's operators and speed: coverage and probe cache key
  kService = 1u << 1,   // the fleet service sets it for every attempt; a job may not
  kBareFlag = 1u << 2,  // on the command line `--key` alone means true
  kPath = 1u << 3,      // a file or folder: made absolute when a job file is submitted
};

inline constexpr std::int64_t kBig = std::int64_t{1} << 40;

// The model kinds whose defaults differ (job_contract.def's mlp, cnn, onnx_images columns).
enum class DefaultsKind { base, mlp, cnn, onnx_images };
// An ONNX model trains on MNIST images unless given text (data set, and not 'mnist').
constexpr DefaultsKind defaults_kind(std::string_view model, bool data_given,
                                     std::string_view data) {
  if (model == "mlp")
    return DefaultsKind::mlp;
  if (model == "cnn")
    return DefaultsKind::cnn;
  if (model == "onnx" && (!data_given || data == "mnist"))
    return DefaultsKind::onnx_images;
  return DefaultsKind::base;
}

struct TrainKey {
  std::string_view name;
  KeyType type;
  std::string_view base;  // the default, as text
  std::int64_t int_lo, int_hi;
  double real_lo, real_hi;
  std::string_view choices;  // TEXT: "a|b|c", "" for any
  const char* mlp;           // that kind's default where it differs from base, else nullptr
  const char* cnn;
  const char* onnx_images;
  unsigned roles;
  std::string_view help;

  constexpr bool has(Role role) const { return (roles & role) != 0; }
  // That kind's default where job_contract.def gives one of its own, else nullptr.
  constexpr const char* own_default(DefaultsKind kind) const {
    return kind == DefaultsKind::mlp           ? mlp
           : kind == DefaultsKind::cnn         ? cnn
           : kind == DefaultsKind::onnx_images ? onnx_images
                                               : nullptr;
  }
  // The default for a model kind, as text.
  constexpr std::string_view default_for(DefaultsKind kind) const {
    const char* own = own_default(kind);
    return own != nullptr ? std::string_view(own) : base;
  }
};

// Every key, in job_contract.def's order.
inline constexpr TrainKey kTrainKeys[] = {
#define LOOM_TRAIN_KEY(name, type, base, lo, hi, choices, mlp, cnn, onnx_images, roles, help) \
  TrainKey{#name,                                                                             \
           LOOM_CONTRACT_KIND_##type,                                                         \
           LOOM_CONTRACT_BASE_##type(base),                                                   \
           static_cast<std::int64_t>(lo),                                                     \
           static_cast<std::int64_t>(hi),                                                     \
           static_cast<double>(lo),                                                           \
           static_cast<double>(hi),                                                           \
           choices,                                                                           \
           mlp,                                                                               \
           cnn,                                                                               \
           onnx_images,                                                                       \
           roles,                                                                             \
           help},
#include "core/job_contract.def"
#undef LOOM_TRAIN_KEY
};

// The key named `name`, or nullptr.
constexpr const TrainKey* find_train_key(std::string_view name) {
  for (const TrainKey& key : kTrainKeys)
    if (key.name == name)
      return &key;
  return nullptr;
}

// Parsing a key's text form (a YAML scalar, a flag's value). Each throws loom::Error naming
// `where` (the source, key and value) and what was expected. Inline: the planning column
// links no engine library.
inline std::int64_t parse_integer(const TrainKey& key, const std::string& text,
                                  const std::string& where) {
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  check(ec == std::errc() && end == text.data() + text.size(), where + " is not an integer");
  check(value >= key.int_lo && value <= key.int_hi, where + " is out of range; expected " +
                                                        std::to_string(key.int_lo) + " to " +
                                                        std::to_string(key.int_hi));
  return value;
}

inline double parse_real(const TrainKey& key, const std::string& text, const std::string& where) {
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(text, &used);
    check(used == text.size(), where + " is not a number");
  } catch (const std::logic_error&) {
    throw Error(where + " is not a number");
  }
  check(value >= key.real_lo && value <= key.real_hi, where + " is out of range; expected " +
                                                          std::to_string(key.real_lo) + " to " +
                                                          std::to_string(key.real_hi));
  return value;
}

inline bool parse_boolean(const std::string& text, const std::string& where) {
  if (text == "true" || text == "1" || text == "yes" || text == "on")
    return true;
  if (text == "false" || text == "0" || text == "no" || text == "off")
    return false;
  throw Error(where + " is not a boolean; expected true or false");
}

// A TEXT key's value, checked against its choices (any text where it has none).
inline const std::string& parse_text(const TrainKey& key, const std::string& text,
                                     const std::string& where) {
  if (key.choices.empty())
    return text;
  std::string list;
  bool listed = false;
  for (std::size_t at = 0; at <= key.choices.size();) {
    std::size_t bar = key.choices.find('|', at);
    if (bar == std::string_view::npos)
      bar = key.choices.size();
    const std::string_view choice = key.choices.substr(at, bar - at);
    listed = listed || choice == text;
    list += (list.empty() ? "" : ", ") + std::string(choice);
    at = bar + 1;
  }
  check(listed, where + " is not one of: " + list);
  return text;
}

// Checks `text` as a value of `key`, whatever its type.
inline void check_value(const TrainKey& key, const std::string& text, const std::string& where) {
  switch (key.type) {
    case KeyType::integer:
      parse_integer(key, text, where);
      break;
    case KeyType::real:
      parse_real(key, text, where);
      break;
    case KeyType::boolean:
      parse_boolean(text, where);
      break;
    case KeyType::text:
      parse_text(key, text, where);
      break;
  }
}

}  // namespace loom::contract
