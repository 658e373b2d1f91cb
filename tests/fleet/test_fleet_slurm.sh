#!/usr/bin/env bash
# The fleet service on Slurm: two local single-node clusters ("sites") with typed fake
# GPUs (site-a: h100 and 910b; site-b: a100), pools mapped to their GRES types.
#  - a job runs under Slurm with the right GRES type, and its state comes back;
#  - a job for the a100 pool runs on the other site (one service, two clusters);
#  - a preempted Slurm job checkpoints, is requeued and resumes to the end;
#  - kill -9 of the daemon while a Slurm job runs: restarted, it finds the job (no second
#    submission), sees it running and can stop it.
# Needs root and Debian's slurm-wlm and munge: fails without them, skips (exit 77) with LOOM_ALLOW_SKIP=1.
# Usage: test_fleet_slurm.sh path/to/loom
set -u
loom=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/fleet_lib.sh"
source "$here/slurm/cluster.sh"
# A host that cannot run the clusters fails the test (it is part of make test, and CI must
# not pass it by skipping); LOOM_ALLOW_SKIP=1 makes that a skip (CTest: exit 77).
if ! slurm_available; then
  [[ -n "${LOOM_ALLOW_SKIP:-}" ]] && { echo "SKIP: Slurm cannot run here (above)"; exit 77; }
  echo "FAIL: Slurm cannot run here (above); install-deps installs it (root); LOOM_ALLOW_SKIP=1 skips"
  exit 1
fi
dir=$(mktemp -d)
cleanup() {
  fleet_kill
  slurm_cluster_down site-a > /dev/null 2>&1
  slurm_cluster_down site-b > /dev/null 2>&1
  [[ -n "${KEEP:-}" ]] || rm -rf "$dir"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# Ports the kernel picks now, not fixed ones: a cluster left up by a killed run, or another
# checkout's test on this host, cannot hold them.
read -r ctld_a slurmd_a ctld_b slurmd_b < <(slurm_free_ports 4)
slurm_cluster_up site-a "$ctld_a" "$slurmd_a" h100:2,910b:2 > /dev/null || { echo "FAIL: site-a did not start"; exit 1; }
slurm_cluster_up site-b "$ctld_b" "$slurmd_b" a100:2 > /dev/null || { echo "FAIL: site-b did not start"; exit 1; }
cd "$dir"
cat > pools.yaml <<YAML
pools:
  - {name: h100, executor: slurm, slurm_conf: $SLURM_CONF_SITE_A, partition: main, gres: "gpu:h100:1", backend: cpu, slots: 1, threads: 1, price_per_hour: 4}
  - {name: npu, executor: slurm, slurm_conf: $SLURM_CONF_SITE_A, partition: main, gres: "gpu:910b:1", backend: cpu, slots: 1, threads: 1, price_per_hour: 2}
  - {name: a100, executor: slurm, slurm_conf: $SLURM_CONF_SITE_B, partition: main, gres: "gpu:a100:1", backend: cpu, slots: 1, threads: 1, price_per_hour: 3}
YAML
# The daemon's jobs inherit LOOM_TEST_HOLD_AT_STEP=1000 (sbatch passes the environment on):
# a job longer than that holds after its step 1000 until it is signalled, so the preemption
# and the daemon's kill below always find it running, however fast the machine is (the
# short jobs never reach it; a job resumed at step 1000 does not hold again).
LOOM_TEST_HOLD_AT_STEP=1000 fleet_start "$dir/state" pools.yaml || { echo "FAIL: the daemon did not start"; exit 1; }
tiny="{layers: 1, width: 32, heads: 2, context: 16, batch: 4, eval_every: 0, final_eval: false, ckpt_every: 50, data: $root/data/tinyshakespeare/input.txt}"
job() {  # NAME STEPS POOL PRIORITY
  cat > "$1.yaml" <<YAML
name: $1
steps: $2
priority: $4
pools: [$3]
config: $tiny
YAML
  submit_id "$1.yaml"
}
slurm_id() {  # JOB ATTEMPT: the Slurm job id the service recorded
  "$loom" fleet status "$1" --json | python3 -c "import json,sys; print([a for a in json.load(sys.stdin)['attempt_list'] if a['number'] == $2][0].get('pid', ''))"
}

# --- a job on the h100 pool: the GRES type, the state reflected back ------------------------
a=$(job on-h100 200 h100 0)
wait_state "$a" "running|succeeded" 60 || fail "the h100 job did not start"
id=$(slurm_id "$a" 1)
gres=$(slurm_on site-a squeue -h -t all -j "$id" -o %b)
[[ "$gres" == *gpu:h100:1* ]] || fail "Slurm job $id asked for '$gres', expected gpu:h100:1"
name=$(slurm_on site-a squeue -h -t all -j "$id" -o %j)
[[ "$name" == "loom-$a-1" ]] || fail "Slurm job $id is named '$name', expected loom-$a-1"
wait_state "$a" succeeded 120 || fail "the h100 job did not succeed"
state=$(slurm_on site-a squeue -h -t all -j "$id" -o %T)
[[ "$state" == COMPLETED ]] || fail "Slurm says $state for job $id"

# --- the a100 pool is the other site --------------------------------------------------------
b=$(job on-a100 100 a100 0)
wait_state "$b" succeeded 120 || fail "the a100 job did not succeed"
id=$(slurm_id "$b" 1)
[[ "$(slurm_on site-b squeue -h -t all -j "$id" -o %b)" == *gpu:a100:1* ]] || fail "the a100 job is not site-b's job $id"

# --- preemption under Slurm -------------------------------------------------------------------
# The low job must still be running when the high one arrives (at a fixed 4,000 steps it
# once finished first and was never preempted): it holds at step 1000 until preempted, and
# the high one is submitted once it is there ("running" under Slurm means only that sbatch
# took the job, which may still be pending).
low=$(job low 2000 npu 0)
wait_state "$low" running 60 || fail "the low-priority job did not start"
wait_training "$low" "$dir/state" 300 1000 || fail "the low-priority job did not reach step 1000"
high=$(job high 100 npu 10)
wait_state "$high" succeeded 180 || fail "the high-priority job did not run"
wait_state "$low" succeeded 300 || fail "the preempted job did not finish"
"$loom" fleet status "$low" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
attempts = [(a["pool"], a["state"], a.get("exit_code")) for a in j["attempt_list"]]
print("preempted Slurm job:", attempts)
assert j["preemptions"] >= 1 and attempts[0][2] == 75 and attempts[-1][2] == 0, attempts' || fail "preemption under Slurm (above)"

# --- kill -9 of the daemon while a Slurm job runs ---------------------------------------------
# The job holds at step 1000, so it is still running when the new daemon starts: that
# daemon must find it (no second submission), see it running and stop it (a cancel).
c=$(job adopt 3000 h100 0)
wait_state "$c" running 60 || fail "the job to adopt did not start"
wait_training "$c" "$dir/state" 120 || fail "the job to adopt did not train"
fleet_kill
LOOM_TEST_HOLD_AT_STEP=1000 fleet_start "$dir/state" pools.yaml || fail "restart"
attempt_ended "$c" "$dir/state" && fail "the job to adopt ended while the daemon was down: adoption not tested"
wait_state "$c" running 60 || fail "the restarted daemon does not see the adopted Slurm job running"
"$loom" fleet cancel "$c" > /dev/null || fail "cancel of the adopted Slurm job"
wait_state "$c" cancelled 120 || fail "the restarted daemon could not stop the adopted Slurm job"
submitted=$(slurm_on site-a squeue -h -t all --name "loom-$c-1" -o %i | wc -l)
[[ $submitted == 1 ]] || fail "attempt 1 of job $c was submitted $submitted times"
[[ $(grep -c '"event":"start"' "$dir/state/jobs/$c/records.jsonl") == 1 ]] || fail "the adopted job started twice"

fleet_stop
if (( failures > 0 )); then
  echo "$failures failure(s)"
  exit 1
fi
echo "fleet on Slurm: all checks passed"
