// cluster/sched/fleet — what a fleet is made of: pools of identical nodes, each pool of
// one chip type. Read from a compact spec ("v100:38x8,p100:38x8") or a YAML file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::cluster {

struct Pool {
  std::string chip;  // a chip id of the catalog, or a trace's worker type ("v100")
  std::int64_t nodes = 0;
  std::int64_t chips_per_node = 0;
  std::int64_t chips() const { return nodes * chips_per_node; }
};

// A chip type may have several pools of different node sizes (e.g. 1-, 4- and 8-GPU
// nodes of one model); a job that can run on the chip type can run on any of them.
struct Fleet {
  std::vector<Pool> pools;
  std::int64_t chips() const;
  // The pool's name in reports: its chip, or "chip:NODESxCHIPS" when the chip has more
  // than one pool.
  std::string label(std::size_t pool) const;
  std::string describe() const;  // "v100:38x8, p100:38x8 (608 chips)"
};

// "CHIP:NODESxCHIPS[,CHIP:NODESxCHIPS...]"; "CHIP:N" means N single-chip nodes.
Fleet parse_fleet(const std::string& spec);
// A YAML file: pools: [{chip: h100-sxm, nodes: 128, chips_per_node: 8}, ...]
Fleet load_fleet(const std::string& path);
// A spec or, when it names an existing file, that file.
Fleet fleet_from(const std::string& spec_or_path);

}  // namespace loom::cluster
