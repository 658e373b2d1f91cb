#include "train/layout.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/planned_layout.h"
#include "io/atomic_file.h"

namespace loom::train {

namespace {

// The layout's text: the file, or standard input read by rank 0 and broadcast (an MPI
// launcher gives standard input to rank 0 alone).
std::string layout_text(const std::string& path, dist::Communicator& world) {
  if (path != "-")
    return io::read_whole_file(path);
  std::string text;
  if (world.rank() == 0)
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  if (world.size() == 1)
    return text;
  std::uint64_t size = text.size();
  world.broadcast(std::as_writable_bytes(std::span(&size, 1)), 0);
  text.resize(size);
  world.broadcast(std::as_writable_bytes(std::span(text.data(), text.size())), 0);
  return text;
}

}  // namespace

void apply_layout(TrainConfig& cfg, dist::Communicator& world) {
  const std::string source = "layout " + (cfg.layout == "-" ? "(standard input)" : cfg.layout);
  const contract::PlannedLayout l =
      contract::parse_planned_layout(layout_text(cfg.layout, world), source);
  const std::int64_t kv_heads = cfg.kv_heads > 0 ? cfg.kv_heads : cfg.heads;
  const std::string refusal = contract::engine_refusal(l, kv_heads);
  check(refusal.empty(), source + ": " + refusal +
                             " (loom plan --engine searches only the layouts loom train runs)");
  check(l.processes() == world.size(),
        source + ": " + l.describe() + " is " + std::to_string(l.processes()) +
            " processes, this job has " + std::to_string(world.size()) + " (mpirun -np " +
            std::to_string(l.processes()) + ")");
  // Each key as the layout says, unless the run set it to something else.
  const nlohmann::json current = nlohmann::json::parse(cfg.to_json());
  auto put = [&](const std::string& key, const std::string& value) {
    if (cfg.explicitly_set.count(key)) {
      const nlohmann::json& v = current[key];
      const std::string mine = v.is_string() ? v.get<std::string>() : v.dump();
      check(mine == value, source + ": " + key + " = " + value +
                               " in the layout, but the run sets " + key + " = " + mine +
                               "; leave it out or make them agree");
    }
    cfg.set(key, value, source);
  };
  put("tp", std::to_string(l.tp));
  put("pipeline", std::to_string(l.pp));
  std::string stages;
  if (l.pp > 1)
    for (std::int64_t n : l.stage_layers)
      stages += (stages.empty() ? "" : ",") + std::to_string(n);
  put("stages", stages);
  put("micro_batches", std::to_string(l.pp > 1 ? l.global_batch / (l.dp * l.micro_batch) : 0));
  put("batch", std::to_string(l.global_batch));
  put("context", std::to_string(l.seq));
  put("zero", std::to_string(l.zero));
}

}  // namespace loom::train
