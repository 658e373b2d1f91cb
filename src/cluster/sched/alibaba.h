// cluster/sched/alibaba — Alibaba PAI's 2023 GPU-sharing trace (alibaba/clusterdata,
// cluster-trace-gpu-v2023; Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
// Workloads with Fragmentation Gradient Descent", USENIX ATC 2023) as a fleet and a job
// list for the simulator (simulator.h).
//
// The node list gives the fleet: one pool per (GPU model, GPUs per node). The pod list
// gives the jobs: a pod arrives at its creation time and asks for num_gpu whole GPUs, or,
// with num_gpu = 1 and gpu_milli below 1,000, for that share of one GPU (Job::milli);
// gpu_spec ("V100M16|V100M32") names the GPU models it may run on (empty: any). The trace
// does not disclose how fast its models are (G1-G3 are not even named), so a pod runs
// equally long on every model it may use: its deletion time minus its scheduled time.
// Pods that cannot be replayed are counted, never dropped silently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/sched/fleet.h"
#include "cluster/sched/jobs.h"

namespace loom::cluster {

struct AlibabaTrace {
  Fleet fleet;
  std::vector<Job> jobs;                // ids 0, 1, ... in the pod list's order
  std::vector<std::string> job_models;  // per job: the models it may use, "|"-joined ("": any)
  std::int64_t pods = 0;                // rows in the pod list
  std::int64_t cpu_only = 0;            // num_gpu = 0: not GPU jobs, not replayed
  std::int64_t never_scheduled = 0;     // no scheduled_time (still pending): no run time
  std::int64_t no_run_time = 0;         // deletion at or before scheduling: no run time
  std::int64_t shared = 0;              // replayed pods asking for a share of one GPU
  std::int64_t constrained = 0;         // replayed pods with a GPU type constraint
  std::int64_t gpu_nodes = 0, cpu_nodes = 0;  // nodes with and without GPUs
};

// Errors name the file, the line, the field, the value and what was expected.
AlibabaTrace load_alibaba_trace(const std::string& pods_csv, const std::string& nodes_csv);

}  // namespace loom::cluster
