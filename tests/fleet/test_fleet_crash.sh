#!/usr/bin/env bash
# The fleet service survives kill -9 at any moment (docs/fleet.md, "Crash safety"):
#  1. at each injected crash point of launching and finishing a job, the daemon dies;
#     restarted, it loses no job and starts none twice;
#  2. 20 kill -9 at random moments while 10 jobs run (more are submitted where a fast machine
#     has finished them, so every kill finds work in the daemon): 0 jobs lost, 0 jobs with
#     two live processes, every job succeeds.
# The assertions read the jobs' own start and end records (written by the processes that
# ran them), not the service's database.
# Usage: test_fleet_crash.sh path/to/loom
set -u
loom=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/fleet_lib.sh"
dir=$(mktemp -d)
trap 'fleet_kill; pkill -KILL -f "$dir/" 2>/dev/null; [[ -n "${KEEP:-}" ]] || rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cd "$dir"
cat > pools.yaml <<YAML
pools:
  - {name: cpu-a, backend: cpu, slots: 2, threads: 1}
  - {name: cpu-b, backend: cpu, slots: 1, threads: 1}
YAML
job() {  # NAME STEPS
  cat > "$1.yaml" <<YAML
name: $1
steps: $2
config: {layers: 1, width: 32, heads: 2, context: 16, batch: 4, eval_every: 0, final_eval: false, ckpt_every: 50, data: $root/data/tinyshakespeare/input.txt}
YAML
  "$loom" fleet submit "$1.yaml" > /dev/null || fail "submit $1"
}

# Checks every job's records: attempts never overlap, the last one ended with status 0,
# and its metrics hold each step once.
check_records() {  # STATE EXPECTED_JOBS
  python3 - "$1" "$2" <<'PY'
import json, os, sys
state, expected = sys.argv[1], int(sys.argv[2])
jobs = sorted(os.listdir(f"{state}/jobs"), key=int)
bad = []
if len(jobs) != expected:
    bad.append(f"{len(jobs)} job folders, expected {expected}")
for j in jobs:
    path = f"{state}/jobs/{j}/records.jsonl"
    if not os.path.exists(path):
        bad.append(f"job {j}: never started (lost)")
        continue
    records = [json.loads(l) for l in open(path)]
    live = None
    for r in records:
        if r["event"] == "start":
            if live is not None:
                bad.append(f"job {j}: attempt {r['attempt']} started while attempt {live} was live")
            live = r["attempt"]
        else:
            if live != r["attempt"]:
                bad.append(f"job {j}: end of attempt {r['attempt']} without its start")
            live = None
    if live is not None:
        bad.append(f"job {j}: attempt {live} never ended")
    ends = [r for r in records if r["event"] == "end"]
    if not ends or ends[-1]["exit"] != 0:
        bad.append(f"job {j}: did not succeed ({ends[-1] if ends else 'no end record'})")
    steps = [json.loads(l)["step"] for l in open(f"{state}/jobs/{j}/out/metrics.jsonl") if '"loss"' in l]
    if steps != list(range(1, len(steps) + 1)) or not steps:
        bad.append(f"job {j}: metrics.jsonl does not hold each step once")
attempts = sum(sum(1 for l in open(f"{state}/jobs/{j}/records.jsonl") if '"start"' in l)
               for j in jobs if os.path.exists(f"{state}/jobs/{j}/records.jsonl"))
print(f"{len(jobs)} jobs, {attempts} attempts; problems: {len(bad)}")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
}

# --- 1. each crash point ---------------------------------------------------------------
points=(launch:before_commit launch:after_commit launch:after_fork finish:before_record finish:after_record)
# The six jobs are queued on drained pools (a daemon that could launch the first one would
# reach a crash point before the sixth submit), then the pools reopen.
fleet_start "$dir/points" pools.yaml || { echo "FAIL: start"; exit 1; }
"$loom" fleet drain cpu-a > /dev/null && "$loom" fleet drain cpu-b > /dev/null || fail "drain"
for i in 1 2 3 4 5 6; do job "p$i" 150; done
"$loom" fleet drain --undo cpu-a > /dev/null && "$loom" fleet drain --undo cpu-b > /dev/null \
  || fail "undrain"
for p in "${points[@]}"; do
  fleet_kill 2>/dev/null
  fleet_start "$dir/points" pools.yaml --crash-at "$p" || fail "restart before $p"
  for _ in $(seq 1 300); do kill -0 "$fleet_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$fleet_pid" 2>/dev/null; then
    fail "crash point $p was never reached"
  else
    grep -q "crash point $p reached" "$dir/points.serve.log" || fail "the daemon died, but not at $p"
  fi
done
fleet_kill
fleet_start "$dir/points" pools.yaml || fail "final restart"
wait_all_done 180 || fail "jobs did not finish after the crash points"
check_records "$dir/points" 6 || fail "records after the crash points (above)"
fleet_stop

# --- 2. 20 random kill -9 during a 10-job run -----------------------------------------------
# Each kill lands 0-0.9 s after the daemon is up, at a moment when the daemon still has a job
# to run: where a fast machine has finished the ten, another job is submitted first, so no
# kill falls on an idle daemon however fast the jobs run.
fleet_start "$dir/loop" pools.yaml || fail "start the loop's daemon"
for i in $(seq 1 10); do job "j$i" $(( 1000 + 200 * i )); done
submitted=10
unfinished() {
  "$loom" fleet status --json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
print(sum(j["state"] not in ("succeeded", "failed", "cancelled", "unplaceable") for j in jobs))'
}
RANDOM=11
for k in $(seq 1 20); do
  if [[ "$(unfinished)" == 0 ]]; then
    job "extra$k" 2000
    submitted=$((submitted + 1))
  fi
  sleep "0.$(( RANDOM % 10 ))"
  fleet_kill
  fleet_start "$dir/loop" pools.yaml || fail "restart $k"
done
echo "20 kills; $submitted jobs submitted ($((submitted - 10)) added to keep the daemon busy)"
wait_all_done 240 || fail "jobs did not finish after 20 kills"
check_records "$dir/loop" "$submitted" || fail "records after 20 kills (above)"
"$loom" fleet status --json | python3 -c '
import json, sys
states = [j["state"] for j in json.load(sys.stdin)["jobs"]]
assert states == ["succeeded"] * len(states) and len(states) == int(sys.argv[1]), states' "$submitted" ||
  fail "the store disagrees with the records"
fleet_stop

if (( failures > 0 )); then
  echo "$failures failure(s)"
  exit 1
fi
echo "fleet crash safety: all checks passed"
