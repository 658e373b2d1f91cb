#!/usr/bin/env bash
# `loom fleet serve` on local pools (cpu, opencl, partial), as a user drives it:
#  - bad input gets a 4xx naming the field and value, and stores nothing;
#  - a retried submit with the same idempotency key makes no second job;
#  - coverage routes strict jobs (no CPU fallbacks) away from the partial backend, and a
#    strict job no pool can run is unplaceable, then refused at submit (422);
#  - a mixed batch (GPT, MLP, CNN, an ONNX import; strict and not; a deadline; a cheap
#    one) all finish, each placement with its reason;
#  - preemption and migration: a low-priority job on the cpu pool is preempted by a
#    high-priority one, checkpoints, resumes on the opencl pool, and ends within 1e-3 of
#    an uninterrupted cpu run's final loss;
#  - cancel; a kill -9 of the daemon while a job runs: the restarted daemon adopts it and
#    can stop it.
# The preemption, cancel and adoption checks hold their jobs at a step until signalled
# (LOOM_TEST_HOLD_AT_STEP), so no machine is fast enough to finish a job before its signal.
# Usage: test_fleet_service.sh path/to/loom
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
has_opencl=0
"$loom" train --layers 1 --width 16 --heads 2 --context 8 --batch 2 --steps 1 --save false \
  --final_eval false --device opencl --data "$root/data/tinyshakespeare/input.txt" \
  --out "$dir/probe" > /dev/null 2>&1 && has_opencl=1

cat > pools.yaml <<YAML
pools:
  - {name: cpu, executor: local, backend: cpu, slots: 1, threads: 1, price_per_hour: 1.0}
  - {name: partial, backend: partial, slots: 1, threads: 1, price_per_hour: 0.1}
YAML
[[ $has_opencl == 1 ]] && echo "  - {name: opencl, backend: opencl, slots: 1, threads: 1, price_per_hour: 0.5}" >> pools.yaml
fleet_start "$dir/state" pools.yaml || { echo "FAIL: the daemon did not start"; exit 1; }
tiny="{layers: 1, width: 32, heads: 2, context: 16, batch: 4, eval_every: 0, final_eval: false, data: $root/data/tinyshakespeare/input.txt}"

# --- bad input --------------------------------------------------------------------------
post() { curl -s -o "$dir/answer" -w '%{http_code}' -X POST -H 'Content-Type: application/json' --data "$1" "$LOOM_FLEET_SERVER/api/jobs"; }
expect_4xx() {  # BODY NEEDLE
  local code; code=$(post "$1")
  [[ $code == 4* ]] || fail "body $1: HTTP $code, expected 4xx"
  grep -qF -- "$2" "$dir/answer" || fail "body $1: answer $(cat "$dir/answer") does not name '$2'"
}
expect_4xx '{"name": "x", "config": {' "not valid JSON"
expect_4xx '{"name": "x", "config": {}, "colour": "red"}' "field 'colour'"
expect_4xx '{"name": "x", "config": {}, "steps": 1e30}' "field 'steps' is 1e+30"
expect_4xx '{"name": "x", "config": {}, "priority": 1000}' "field 'priority' is 1000"
expect_4xx '{"name": "x", "config": {}, "pools": ["gpu-x"]}' "names 'gpu-x', which is not a pool"
expect_4xx '{"name": "x", "config": {"out": "/tmp"}}' "field 'config.out'"
expect_4xx '{"name": "", "config": {}}' "field 'name'"
expect_4xx '[1, 2]' "a job is a JSON object"
python3 -c 'print("{\"name\": \"x\", \"config\": {\"data\": \"" + "a" * 2000000 + "\"}}")' > big.json
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST --data @big.json "$LOOM_FLEET_SERVER/api/jobs")
[[ $code == 413 ]] || fail "a 2 MB body: HTTP $code, expected 413"
count=$("$loom" fleet status --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')
[[ $count == 0 ]] || fail "refused requests stored $count jobs"

# --- idempotency -------------------------------------------------------------------------
cat > strict.yaml <<YAML
name: strict-gpt
steps: 40
allow_fallback: false
pools: [partial, cpu]
idempotency_key: strict-1
config: $tiny
YAML
first=$(submit_id strict.yaml)
second=$(submit_id strict.yaml)
[[ "$first" == "$second" ]] || fail "the same idempotency key made jobs $first and $second"
wait_state "$first" succeeded 120 || fail "the strict job did not succeed"
pool=$("$loom" fleet status "$first" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pool"])')
[[ "$pool" != partial ]] || fail "a strict job ran on the partial pool (its backend falls back)"

# --- a strict job only the partial pool could take (a model not probed yet) ---------------
cat > partial-only.yaml <<YAML
name: partial-only
steps: 20
allow_fallback: false
pools: [partial]
config: {layers: 1, width: 48, heads: 2, context: 16, batch: 4, data: $root/data/tinyshakespeare/input.txt}
YAML
only=$(submit_id partial-only.yaml)
wait_state "$only" unplaceable 120 || fail "a strict job for the partial pool alone is not unplaceable"
"$loom" fleet status "$only" | grep -q "fall back to the CPU for" || fail "unplaceable without the fallback ops named"
sed -i 's/name: partial-only/name: partial-only-again/' partial-only.yaml
out=$("$loom" fleet submit partial-only.yaml 2>&1) && fail "a job cached coverage rules out was accepted"
[[ "$out" == *"no acceptable pool runs its model natively"* ]] || fail "422 without the reason: $out"

# --- a mixed batch ------------------------------------------------------------------------
cat > gpt.yaml <<YAML
name: gpt
steps: 80
config: $tiny
YAML
cat > mlp.yaml <<YAML
name: mlp
steps: 30
config: {model: mlp, data: mnist, mnist_dir: $root/data/mnist, batch: 32}
YAML
cat > cnn.yaml <<YAML
name: cnn
steps: 10
allow_fallback: false
config: {model: cnn, data: mnist, mnist_dir: $root/data/mnist, batch: 16}
YAML
cat > onnx.yaml <<YAML
name: onnx-mlp
steps: 20
config: {model: onnx, onnx: $root/tests/fixtures/onnx/mlp_mnist.onnx, data: mnist, mnist_dir: $root/data/mnist, batch: 32}
YAML
cat > deadline.yaml <<YAML
name: deadline-gpt
steps: 60
deadline_h: 0.5
allow_fallback: false
config: $tiny
YAML
cat > cheap.yaml <<YAML
name: cheap-gpt
steps: 40
priority: -5
config: $tiny
YAML
ids=()
for f in gpt mlp cnn onnx deadline cheap; do ids+=("$(submit_id $f.yaml)"); done
wait_all_done 300 || fail "the mixed batch did not finish"
for id in "${ids[@]}"; do
  s=$(job_state "$id")
  [[ $s == succeeded ]] || { fail "job $id: $s"; "$loom" fleet status "$id"; }
done
"$loom" fleet status --json | python3 -c '
import json, sys
for j in json.load(sys.stdin)["jobs"]:
    if not j["allow_fallback"] and j["state"] == "succeeded":
        assert j["pool"] != "partial", "strict job %d ran on partial" % j["id"]
' || fail "a strict job ran on the partial pool"
"$loom" fleet events | grep -q "placed .*attempt 1 on .*: " || fail "placements carry no reason"

# From here on the daemon's jobs inherit LOOM_TEST_HOLD_AT_STEP=1000: a job longer than
# that holds after its step 1000 until it is signalled, so the preemption, the cancel and
# the daemon's kill below always find it running, however fast the machine is (the short
# jobs, 300 steps, never reach it). A job resumed at step 1000 does not hold again.
fleet_stop
LOOM_TEST_HOLD_AT_STEP=1000 fleet_start "$dir/state" pools.yaml || { echo "FAIL: the daemon did not restart"; exit 1; }

# --- preemption and migration --------------------------------------------------------------
if [[ $has_opencl == 1 ]]; then
  long="{layers: 1, width: 32, heads: 2, context: 16, batch: 4, eval_every: 0, final_eval: false, seed: 7, data: $root/data/tinyshakespeare/input.txt}"
  "$loom" train --layers 1 --width 32 --heads 2 --context 16 --batch 4 --eval_every 0 \
    --final_eval false --seed 7 --steps 2000 --threads 1 --json --progress false \
    --data "$root/data/tinyshakespeare/input.txt" --out "$dir/reference" > reference.log 2>&1 || fail "reference run"
  cat > low.yaml <<YAML
name: low
steps: 2000
priority: 0
pools: [cpu, opencl]
config: $long
YAML
  cat > high.yaml <<YAML
name: high
steps: 300
priority: 10
pools: [cpu]
config: $tiny
YAML
  low=$(submit_id low.yaml)
  wait_state "$low" running 120 || fail "the low-priority job did not start"
  low_pool=$("$loom" fleet status "$low" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pool"])')
  [[ $low_pool == cpu ]] || fail "the low-priority job started on $low_pool, expected cpu (fastest)"
  # Once it holds at step 1000: it cannot end before the preemption, which stops it there
  # (and its resumed attempt, starting at step 1000, does not hold again).
  wait_training "$low" "$dir/state" 300 1000 || fail "the low-priority job did not reach step 1000"
  high=$(submit_id high.yaml)
  wait_state "$high" succeeded 180 || fail "the high-priority job did not run"
  wait_state "$low" succeeded 300 || fail "the preempted job did not finish"
  python3 - "$LOOM_FLEET_SERVER" "$low" reference.log <<'PY' || fail "migration (above)"
import json, sys, urllib.request
server, low, ref = sys.argv[1], sys.argv[2], sys.argv[3]
job = json.load(urllib.request.urlopen(f"{server}/api/jobs/{low}"))
pools = [a["pool"] for a in job["attempt_list"]]
print("low-priority job attempts:", [(a["pool"], a["state"], a.get("exit_code")) for a in job["attempt_list"]])
assert job["preemptions"] >= 1, "never preempted"
assert pools[0] == "cpu" and "opencl" in pools[1:], f"did not move from cpu to opencl: {pools}"
reference = json.loads(open(ref).read().strip().splitlines()[-1])["loss_last"]
final = job["curve"][-1][1]
rel = abs(final - reference) / abs(reference)
print(f"final loss {final:.6f} after migrating cpu -> opencl, uninterrupted cpu {reference:.6f}: relative difference {rel:.2e}")
assert rel < 1e-3, rel
PY
else
  echo "note: no OpenCL device; the preemption and migration check is skipped"
fi

# --- cancel ------------------------------------------------------------------------------------
cat > forever.yaml <<YAML
name: forever
steps: 100000
config: $tiny
YAML
forever=$(submit_id forever.yaml)
wait_state "$forever" running 60 || fail "the long job did not start"
wait_training "$forever" "$dir/state" 120 || fail "the long job did not train"
"$loom" fleet cancel "$forever" > /dev/null || fail "cancel"
wait_state "$forever" cancelled 60 || fail "cancel did not stop the job"

# --- kill -9 of the daemon while a job runs: adopted, not restarted ---------------------------
# The job holds at step 1000 (above), so it is still running when the new daemon starts:
# that daemon must adopt it (running, one start) and control it (a cancel stops it).
cat > adopt.yaml <<YAML
name: adopt
steps: 3000
config: $tiny
YAML
adopt=$(submit_id adopt.yaml)
wait_state "$adopt" running 60 || fail "the job to adopt did not start"
wait_training "$adopt" "$dir/state" 120 || fail "the job to adopt did not train"
fleet_kill
LOOM_TEST_HOLD_AT_STEP=1000 fleet_start "$dir/state" pools.yaml || fail "restart"
attempt_ended "$adopt" "$dir/state" && fail "the job to adopt ended while the daemon was down: adoption not tested"
wait_state "$adopt" running 60 || fail "the restarted daemon does not see the adopted job running"
"$loom" fleet cancel "$adopt" > /dev/null || fail "cancel of the adopted job"
wait_state "$adopt" cancelled 120 || fail "the restarted daemon could not stop the adopted job"
starts=$(grep -c '"event":"start"' "$dir/state/jobs/$adopt/records.jsonl")
[[ $starts == 1 ]] || fail "the adopted job was started $starts times"

fleet_stop
if (( failures > 0 )); then
  echo "$failures failure(s)"
  exit 1
fi
echo "fleet service: all checks passed"
