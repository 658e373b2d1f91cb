// Reader: cluster::load_alibaba_trace (Alibaba PAI 2023: a pod list and a node list, CSV).
// The input holds the pod list, then (after kFileSeparator) the node list; without a
// second part the node list is a small fixed one. Regressions: tests/fixtures/fuzz/alibaba/
// (NAME-pods.csv, NAME-nodes.csv).
#include "cluster/sched/alibaba.h"
#include "core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> parts = loom::fuzz::split_files(loom::fuzz::bytes_of(data, size));
  const std::string pods = loom::fuzz::write_scratch("pods.csv", parts[0]);
  const std::string nodes = loom::fuzz::write_scratch(
      "nodes.csv", parts.size() > 1 ? parts[1]
                                    : "sn,cpu_milli,memory_mib,gpu,model\n"
                                      "n0,64000,262144,8,G2\nn1,64000,262144,2,T4\n");
  try {
    (void)loom::cluster::load_alibaba_trace(pods, nodes);
  } catch (const loom::Error&) {
  }
  return 0;
}
