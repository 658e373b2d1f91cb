#!/usr/bin/env bash
# Training across processes. Data parallel: `mpirun -np 2 loom train` takes the steps one
# process takes with the whole batch (losses within 2e-7 relative: one float32 ulp of
# the loss; measured 1.2e-7), rank 0 alone writes,
# an interrupted 2-process run resumes exactly, a batch that does not divide among the
# processes is a clear error. Pipeline parallel (`--pipeline 2`): the same losses with 2
# or 3 micro-batches, a checkpoint that evaluates as the one-process one does, exact
# resume, clear errors; GPipe and 1F1B bitwise equal; 3 stages. ZeRO stage 1 (`--zero 1`,
# the distributed optimizer): bitwise the numbers of plain data parallelism. Graph mode (`--mode graph`): gradients all-reduced in buckets during the
# backward pass, bitwise the eager numbers on 2 processes. Tensor parallel (`--tp 2`): a
# small llama within 1e-6 of one process, alone and as tp 2 x dp 2 with ZeRO-1, resumed
# exactly. The layouts' comparisons with one process, gradients too, are test_layouts.sh's.
# Usage: test_data_parallel.sh MPIEXEC path/to/loom [STEPS] (10 by default; fewer under the
# sanitizers, where a step of the default GPT takes about 0.4 s).
set -u
mpiexec="$1" loom="$2"
export STEPS="${3:-10}"  # the Python checks below read it
half=$((STEPS / 2))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
# Under AddressSanitizer: Open MPI's runtime keeps allocations until exit that LeakSanitizer
# cannot attribute (its plugins have no frame pointers, so no suppression matches them);
# leak detection is off for these processes only, every other ASan check stays on. Loom's
# own code on this path is leak-checked by the one-process tests.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi=("$mpiexec" -np 2 --oversubscribe --bind-to none)
# Whole checkpoints (rank 0's model.safetensors), compared file to file below; sharded ones
# are tests/dist/test_checkpoints.sh's.
base=(--steps "$STEPS" --final_eval false --progress false --json --threads 1 --ckpt_every 0
  --checkpoint_format whole)
common=("${base[@]}" --eval_every 0)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

"$loom" train "${common[@]}" --out "$dir/one" > "$dir/one.log" 2>&1 || fail "one process: $(tail -n 3 "$dir/one.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --out "$dir/two" > "$dir/two.log" 2>&1 || fail "two processes: $(tail -n 3 "$dir/two.log")"
[[ $(grep -c '^{"steps"' "$dir/two.log") -eq 1 ]] || fail "expected one JSON summary (rank 0), got: $(grep -c '^{"steps"' "$dir/two.log")"
[[ -f "$dir/two/checkpoint/model.safetensors" ]] || fail "rank 0 wrote no checkpoint"
# Interrupted half-way and resumed: the same losses as the uninterrupted run.
"${mpi[@]}" "$loom" train "${common[@]}" --out "$dir/resumed" --stop_after "$half" > "$dir/r1.log" 2>&1 || fail "stop_after: $(tail -n 3 "$dir/r1.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --out "$dir/resumed" --resume > "$dir/r2.log" 2>&1 || fail "resume: $(tail -n 3 "$dir/r2.log")"
python3 - "$dir" <<'PY' || fail "losses differ (above)"
import json, os, sys
d = sys.argv[1]
steps = int(os.environ["STEPS"])
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl") if '"loss"' in l]
one, two, resumed = losses("one"), losses("two"), losses("resumed")
assert len(one) == len(two) == steps, (len(one), len(two))
worst = max(abs(a - b) / abs(a) for a, b in zip(one, two))
print(f"one vs two processes: worst relative loss difference {worst:.2e} over {steps} steps")
assert worst < 2e-7, worst
assert resumed == two, ("resumed run differs", resumed, two)
PY
# ZeRO stage 1 (the distributed optimizer: gradients reduce-scattered, parameters
# all-gathered) changes nothing in the numbers: the same losses, bitwise, and the same
# checkpoint tensors; resume is exact.
"${mpi[@]}" "$loom" train "${common[@]}" --zero 1 --out "$dir/zero" > "$dir/zero.log" 2>&1 || fail "zero 1: $(tail -n 3 "$dir/zero.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --zero 1 --out "$dir/zr" --stop_after "$half" > "$dir/zr1.log" 2>&1 || fail "zero stop_after"
"${mpi[@]}" "$loom" train "${common[@]}" --zero 1 --out "$dir/zr" --resume > "$dir/zr2.log" 2>&1 || fail "zero resume"
python3 - "$dir" <<'PY' || fail "zero 1 differs from plain data parallel (above)"
import json, os, struct, sys
d = sys.argv[1]
steps = int(os.environ["STEPS"])
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl") if '"loss"' in l]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()}
assert losses("zero") == losses("two"), "losses differ"
assert losses("zr") == losses("two"), "resumed losses differ"
for f in ("model.safetensors", "train_state.safetensors"):
    assert tensors(f"{d}/zero/checkpoint/{f}") == tensors(f"{d}/two/checkpoint/{f}"), f
print("zero 1: losses and checkpoint tensors identical to plain data parallel")
PY

# Graph mode: the captured step replayed, its gradients all-reduced in buckets on a
# communication thread during the backward pass (forced: on one machine `auto` does not
# overlap; 0.05 MB buckets: many of them). Two processes: bitwise the eager run's losses
# and weights; three: within 2e-7 of one process.
"${mpi[@]}" "$loom" train "${common[@]}" --mode graph --overlap true --bucket_mb 0.05 --out "$dir/graph" > "$dir/graph.log" 2>&1 \
  || fail "graph mode: $(tail -n 3 "$dir/graph.log")"
grep -qE '"overlapped_buckets":([2-9]|[1-9][0-9])' "$dir/graph.log" || fail "graph mode did not overlap: $(grep steps "$dir/graph.log")"
"$mpiexec" -np 3 --oversubscribe --bind-to none "$loom" train "${common[@]}" --batch 12 --mode graph --bucket_mb 0.05 \
  --overlap true --out "$dir/graph3" > "$dir/graph3.log" 2>&1 || fail "graph mode, 3 processes: $(tail -n 3 "$dir/graph3.log")"
# The distributed optimizer's buckets reduce-scattered to their owners during the backward
# pass: bitwise the eager run's numbers too, the reduce-scatters made behind compute.
"${mpi[@]}" "$loom" train "${common[@]}" --mode graph --overlap true --bucket_mb 0.05 --zero 1 --out "$dir/graph_zero" \
  > "$dir/graph_zero.log" 2>&1 || fail "graph mode, zero 1: $(tail -n 3 "$dir/graph_zero.log")"
grep -qE '"overlapped_buckets":([2-9]|[1-9][0-9])' "$dir/graph_zero.log" \
  && grep -qE '"reduce_scatter":\{[^}]*"overlapped_ms":[0-9.]*[1-9]' "$dir/graph_zero.log" \
  || fail "graph mode, zero 1 did not reduce-scatter behind compute: $(grep steps "$dir/graph_zero.log")"
cmp -s "$dir/graph_zero/checkpoint/model.safetensors" "$dir/two/checkpoint/model.safetensors" \
  || fail "graph mode, zero 1: the 2-process weights differ from the eager run's"
"${mpi[@]}" "$loom" train "${common[@]}" --mode graph --out "$dir/graph_auto" > "$dir/graph_auto.log" 2>&1 \
  || fail "graph mode, overlap auto: $(tail -n 3 "$dir/graph_auto.log")"
grep -q '"graph_nodes"' "$dir/graph_auto.log" && ! grep -q overlapped_buckets "$dir/graph_auto.log" \
  || fail "graph mode, overlap auto on one machine: expected no overlap: $(grep steps "$dir/graph_auto.log")"
cmp -s "$dir/graph/checkpoint/model.safetensors" "$dir/two/checkpoint/model.safetensors" \
  || fail "graph mode: the 2-process weights differ from the eager run's"
python3 - "$dir" <<'PY' || fail "graph mode losses differ (above)"
import json, os, sys
d = sys.argv[1]
steps = int(os.environ["STEPS"])
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl") if '"loss"' in l]
assert losses("graph") == losses("two"), "graph mode, 2 processes: losses differ from eager"
assert losses("graph_auto") == losses("two"), "graph mode, overlap auto: losses differ from eager"
assert losses("graph_zero") == losses("two"), "graph mode, zero 1 overlapped: losses differ from eager"
worst = max(abs(a - b) / abs(a) for a, b in zip(losses("one"), losses("graph3")))
print(f"graph mode: 2 processes bitwise eager; 3 processes vs one: worst relative loss difference {worst:.2e}")
assert len(losses("graph3")) == steps and worst < 2e-7, worst
PY

# Pipeline parallel: two stages of two blocks each.
"${mpi[@]}" "$loom" train "${base[@]}" --pipeline 2 --eval_every 5 --out "$dir/pp" > "$dir/pp.log" 2>&1 \
  || fail "pipeline: $(tail -n 3 "$dir/pp.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --pipeline 2 --micro_batches 3 --out "$dir/pp3" > "$dir/pp3.log" 2>&1 \
  || fail "pipeline, 3 micro-batches: $(tail -n 3 "$dir/pp3.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --pipeline 2 --out "$dir/ppr" --stop_after "$half" > "$dir/ppr1.log" 2>&1 \
  || fail "pipeline stop_after: $(tail -n 3 "$dir/ppr1.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --pipeline 2 --out "$dir/ppr" --resume > "$dir/ppr2.log" 2>&1 \
  || fail "pipeline resume: $(tail -n 3 "$dir/ppr2.log")"
# The two schedules compute the same gradients bitwise; 3 stages exercise 1F1B's warm-up.
"${mpi[@]}" "$loom" train "${common[@]}" --pipeline 2 --micro_batches 4 --pipeline_schedule gpipe --out "$dir/gpipe" \
  > "$dir/gpipe.log" 2>&1 || fail "gpipe: $(tail -n 3 "$dir/gpipe.log")"
"${mpi[@]}" "$loom" train "${common[@]}" --pipeline 2 --micro_batches 4 --pipeline_schedule 1f1b --out "$dir/1f1b" \
  > "$dir/1f1b.log" 2>&1 || fail "1f1b: $(tail -n 3 "$dir/1f1b.log")"
"$mpiexec" -np 3 --oversubscribe --bind-to none "$loom" train "${common[@]}" --pipeline 3 --micro_batches 4 --out "$dir/pp3stages" \
  > "$dir/pp3stages.log" 2>&1 || fail "3 stages: $(tail -n 3 "$dir/pp3stages.log")"
grep -q val_loss_estimate "$dir/pp/metrics.jsonl" || fail "pipeline: no validation estimate in metrics"
head -c 20000 data/tinyshakespeare/input.txt > "$dir/small.txt"  # a short evaluation text
eval_one=$("$loom" eval "$dir/one/checkpoint" --data "$dir/small.txt" 2>&1 | tail -n 1)
eval_pp=$("$loom" eval "$dir/pp/checkpoint" --data "$dir/small.txt" 2>&1 | tail -n 1)
python3 - "$dir" "$eval_one" "$eval_pp" <<'PY' || fail "pipeline losses or checkpoint differ (above)"
import json, os, re, sys
d = sys.argv[1]
steps = int(os.environ["STEPS"])
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl") if '"loss"' in l]
one = losses("one")
for name in ("pp", "pp3", "pp3stages", "1f1b"):
    worst = max(abs(a - b) / abs(a) for a, b in zip(one, losses(name)))
    print(f"one process vs {name}: worst relative loss difference {worst:.2e} over {steps} steps")
    assert len(losses(name)) == steps and worst < 2e-7, (name, worst)
assert losses("ppr") == losses("pp"), "resumed pipeline run differs"
assert losses("gpipe") == losses("1f1b"), "GPipe and 1F1B differ"
number = lambda text: float(re.findall(r"[0-9]+\.[0-9]+", text)[-1])
a, b = number(sys.argv[2]), number(sys.argv[3])
print(f"loom eval: one process {a}, pipeline {b}")
assert abs(a - b) / a < 1e-6, (a, b)
PY
out=$("${mpi[@]}" "$loom" train --pipeline 3 --steps 1 --out "$dir/bad" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"pipeline = 3 needs a multiple of 3 processes"* ]] || fail "pipeline 3 on 2 processes: rc $rc: $(echo "$out" | head -n 3)"
out=$("${mpi[@]}" "$loom" train --pipeline 2 --micro_batches 5 --steps 1 --out "$dir/bad" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"does not divide into micro_batches = 5"* ]] || fail "micro_batches 5: rc $rc: $(echo "$out" | head -n 3)"
out=$("${mpi[@]}" "$loom" train --batch 5 --steps 1 --out "$dir/bad" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"batch = 5 does not divide among the 2 data-parallel processes"* ]] \
  || fail "indivisible batch: rc $rc, output: $(echo "$out" | head -n 3)"
# Tensor parallel (--tp 2): a small grouped-query llama's heads and MLP columns split over two
# processes take one process's steps (losses within 1e-6 relative); tp 2 x dp 2 with ZeRO-1
# over the replicas on four processes too; the checkpoint (gathered whole) evaluates as one
# process's; interrupted runs resume exactly; what cannot split is named. (ZeRO-1 against
# plain tp 2 x dp 2, bitwise: test_layouts.sh's tp2xdp2 and tp2xdp2-zero rows.)
tp=(--model llama --layers 2 --width 64 --heads 4 --kv_heads 2 --context 32 --batch 8 --eval_every 0)
"$loom" train "${tp[@]}" "${base[@]}" --out "$dir/tp_one" > "$dir/tp_one.log" 2>&1 || fail "tp reference: $(tail -n 3 "$dir/tp_one.log")"
"${mpi[@]}" "$loom" train "${tp[@]}" "${base[@]}" --tp 2 --out "$dir/tp2" > "$dir/tp2.log" 2>&1 || fail "tp 2: $(tail -n 3 "$dir/tp2.log")"
"${mpi[@]}" "$loom" train "${tp[@]}" "${base[@]}" --tp 2 --out "$dir/tpr" --stop_after "$half" > "$dir/tpr1.log" 2>&1 \
  || fail "tp stop_after: $(tail -n 3 "$dir/tpr1.log")"
"${mpi[@]}" "$loom" train "${tp[@]}" "${base[@]}" --tp 2 --out "$dir/tpr" --resume > "$dir/tpr2.log" 2>&1 \
  || fail "tp resume: $(tail -n 3 "$dir/tpr2.log")"
# ZeRO-1 over each tensor-parallel rank's replicas: bitwise the numbers without it; resumed exactly.
"$mpiexec" -np 4 --oversubscribe --bind-to none "$loom" train "${tp[@]}" "${base[@]}" --tp 2 --zero 1 --out "$dir/tpz" \
  > "$dir/tpz.log" 2>&1 || fail "tp 2 x dp 2, zero 1: $(tail -n 3 "$dir/tpz.log")"
"$mpiexec" -np 4 --oversubscribe --bind-to none "$loom" train "${tp[@]}" "${base[@]}" --tp 2 --zero 1 --out "$dir/tpzr" \
  --stop_after "$half" > "$dir/tpzr1.log" 2>&1 || fail "tp zero stop_after: $(tail -n 3 "$dir/tpzr1.log")"
"$mpiexec" -np 4 --oversubscribe --bind-to none "$loom" train "${tp[@]}" "${base[@]}" --tp 2 --zero 1 --out "$dir/tpzr" \
  --resume > "$dir/tpzr2.log" 2>&1 || fail "tp zero resume: $(tail -n 3 "$dir/tpzr2.log")"
eval_tp_one=$("$loom" eval "$dir/tp_one/checkpoint" --data "$dir/small.txt" 2>&1 | tail -n 1)
eval_tp=$("$loom" eval "$dir/tp2/checkpoint" --data "$dir/small.txt" 2>&1 | tail -n 1)
python3 - "$dir" "$eval_tp_one" "$eval_tp" <<'PY' || fail "tensor-parallel losses or checkpoint differ (above)"
import json, re, sys
d = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{d}/{name}/metrics.jsonl") if '"loss"' in l]
for ref, name in (("tp_one", "tp2"), ("tp_one", "tpz")):
    one, other = losses(ref), losses(name)
    assert len(other) == len(one), (name, len(other))
    worst = max(abs(a - b) / abs(a) for a, b in zip(one, other))
    print(f"one process vs {name}: worst relative loss difference {worst:.2e}")
    assert worst < 1e-6, (name, worst)
assert losses("tpr") == losses("tp2"), "resumed tensor-parallel run differs"
assert losses("tpzr") == losses("tpz"), "resumed tp x zero run differs"
number = lambda text: float(re.findall(r"[0-9]+\.[0-9]+", text)[-1])
a, b = number(sys.argv[2]), number(sys.argv[3])
print(f"loom eval: one process {a}, tp 2 {b}")
assert abs(a - b) / a < 1e-6, (a, b)
PY
out=$("${mpi[@]}" "$loom" train --tp 2 --steps 1 --out "$dir/bad" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"tensor parallelism splits llama, mistral, qwen2 and qwen3 models, not gpt"* ]] \
  || fail "tp of the gpt: rc $rc: $(echo "$out" | head -n 3)"
out=$("${mpi[@]}" "$loom" train --model llama --width 96 --heads 6 --kv_heads 3 --tp 2 --steps 1 --out "$dir/bad" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"num_key_value_heads = 3 does not divide among the ranks"* ]] \
  || fail "tp 2 with three key/value heads: rc $rc: $(echo "$out" | head -n 3)"
out=$("${mpi[@]}" "$loom" train "${tp[@]}" --tp 3 --steps 1 --out "$dir/bad" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"tp = 3 needs a multiple of 3 processes"* ]] \
  || fail "tp 3 on 2 processes: rc $rc: $(echo "$out" | head -n 3)"
# A dead rank: kill -9 of one process of a tp 2 x dp 2 run ends the whole job within 60 s (no
# rank left waiting in a collective), the launcher naming the rank and the signal.
"$mpiexec" -np 4 --oversubscribe --bind-to none "$loom" train "${tp[@]}" --steps 100000 --threads 1 \
  --progress false --out "$dir/dead" > "$dir/dead.log" 2>&1 &
launcher=$!
for _ in $(seq 1 300); do [[ -s "$dir/dead/metrics.jsonl" ]] && break; sleep 0.2; done  # training
victim=$(pgrep -P "$launcher" | sed -n 2p)  # the second rank the launcher started
if [[ -z "$victim" ]]; then
  fail "dead rank: no rank process found under the launcher"
  kill "$launcher" 2>/dev/null
else
  kill -9 "$victim"
  killed_at=$SECONDS
  for _ in $(seq 1 600); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  waited=$((SECONDS - killed_at))
  if kill -0 "$launcher" 2>/dev/null; then
    fail "dead rank: the job still runs $waited s after kill -9 of one rank"
    kill -9 "$launcher" 2>/dev/null
  fi
  wait "$launcher"; rc=$?
  echo "dead rank: the job ended $waited s after kill -9 of one rank (exit $rc)"
  [[ $rc -ne 0 ]] || fail "dead rank: the job exited 0"
  grep -q "exited on signal 9" "$dir/dead.log" || fail "dead rank: the launcher did not name it: $(tail -n 5 "$dir/dead.log")"
fi
echo "$failures failed"
exit $((failures > 0))
