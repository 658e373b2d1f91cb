// cluster/service/pools — the chip pools a fleet service runs jobs on (pools.yaml):
//
//   pools:
//     - name: cpu            # unique; jobs name pools in their order of preference
//       executor: local      # local: `loom train` processes on this machine
//       backend: cpu         # the Loom backend the pool's jobs train on (loom train --device)
//       slots: 2             # jobs at once
//       threads: 1           # CPU threads per job
//       price_per_hour: 0.5  # per slot-hour (cost = price x predicted hours); 0: unpriced
//       chip: h100-sxm       # optional: the catalog chip the pool stands for
//     - name: h100
//       executor: slurm      # slurm: each job a batch job on a Slurm cluster
//       slurm_conf: /etc/slurm-site-a/slurm.conf   # the cluster (default: Slurm's own)
//       partition: gpu       # optional
//       gres: gpu:h100:1     # the typed GRES each job asks for
//       backend: cuda
//
// Every field is checked, with errors naming the file, the pool, the field and the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::service {

struct PoolSpec {
  std::string name, executor = "local", backend = "cpu", chip;
  std::int64_t slots = 1, threads = 1;
  double price_per_hour = 0;
  // executor slurm: the cluster (its slurm.conf; empty: Slurm's default), the partition
  // and the typed GRES each job asks for (e.g. gpu:h100:1).
  std::string slurm_conf, partition, gres;
};

std::vector<PoolSpec> load_pools(const std::string& path);

}  // namespace loom::service
