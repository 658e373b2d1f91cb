#!/usr/bin/env bash
# Checkpoints that move (docs/distributed.md, "Checkpoints that move"): a sharded checkpoint
# (checkpoint_format = sharded: each process writes the pieces it holds) saved at one layout
# loads at another and, saved again there, holds every logical tensor bitwise the same; the
# run then continues at the new layout as an uninterrupted run there does (losses within the
# layouts' bound, 1e-6 relative). Covers tensor, pipeline and data parallelism with the
# distributed optimizer, and 1 <-> 2 <-> 4 processes (elastic data parallelism: the global
# batch is kept, each replica's share follows the process count).
#
# Usage: test_checkpoints.sh MPIEXEC path/to/loom [suite|quick|all]
#   suite  each layout's checkpoint loaded at the next one's (a cycle), 1 -> 4 and 4 -> 2
#          processes
#   quick  the cycle's first three moves (the sanitizer build's)
#   all    every layout's checkpoint at every other layout (`make checkpoints`)
set -u
mpiexec="$1" loom="$2" mode="${3:-suite}"
dir=$(mktemp -d)
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$dir"' EXIT; echo "files: $dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # as test_data_parallel.sh
export OMP_WAIT_POLICY=PASSIVE  # ranks outnumber the cores (docs/parallel.md)
model=(--model llama --layers 4 --width 64 --heads 4 --kv_heads 2 --context 32 --batch 8 --warmup 2)
base=(--final_eval false --progress false --threads 1 --eval_every 0 --ckpt_every 5
  --keep_checkpoints 5 --checkpoint_format sharded)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
export TESTS_DIST
TESTS_DIST=$(cd "$(dirname "$0")" && pwd)  # sharded_checkpoint.py: the reader the checks use

# name processes flags...
layouts=(
  "one 1"
  "dp2-zero 2 --zero 1"
  "tp2 2 --tp 2"
  "pp2-uneven 2 --pipeline 2 --stages 1,3"
  "tp2xdp2-zero 4 --tp 2 --zero 1"
  "pp2xdp2 4 --pipeline 2"
  "tp2xpp2 4 --tp 2 --pipeline 2"
  "dp4-zero 4 --zero 1"
)
declare -A procs flags
names=()
for entry in "${layouts[@]}"; do
  read -r name np rest <<< "$entry"
  names+=("$name")
  procs[$name]=$np
  flags[$name]="$rest"
done

# Runs layout NAME into OUT with more flags.
run() {
  local name="$1" out="$2"
  shift 2
  # shellcheck disable=SC2086  # the layout's flags split into words
  if [[ "${procs[$name]}" -eq 1 ]]; then
    "$loom" train "${model[@]}" "${base[@]}" ${flags[$name]} --out "$out" "$@"
  else
    "$mpiexec" -np "${procs[$name]}" --oversubscribe --bind-to none -x OMP_WAIT_POLICY \
      "$loom" train "${model[@]}" "${base[@]}" ${flags[$name]} --out "$out" "$@"
  fi
}

# Each layout's own run, once a move or the export needs it: 15 steps, sharded checkpoints
# at 5, 10 and 15.
trained() {
  [[ -f "$dir/$1.log" ]] && return 0
  run "$1" "$dir/$1" --steps 15 > "$dir/$1.log" 2>&1 || { fail "$1: $(tail -n 3 "$dir/$1.log")"; return 1; }
}

# The moves to check: FROM TO pairs.
moves=()
count=${#names[@]}
if [[ "$mode" == "all" ]]; then
  for from in "${names[@]}"; do
    for to in "${names[@]}"; do
      [[ "$from" != "$to" ]] && moves+=("$from $to")
    done
  done
else
  for ((i = 0; i < count; i++)); do
    moves+=("${names[$i]} ${names[$(((i + 1) % count))]}")
  done
  moves+=("one dp4-zero" "dp4-zero dp2-zero")  # the cycle holds dp4-zero -> one
  [[ "$mode" == "quick" ]] && moves=("${moves[@]:0:3}")
fi

echo "| saved at | loaded at | logical tensors | saved again: bitwise | 10 further steps: worst loss rel. diff to an uninterrupted run there |"
echo "|---|---|---|---|---|"
for move in "${moves[@]}"; do
  read -r from to <<< "$move"
  trained "$from" && trained "$to" || continue
  out="$dir/$from-to-$to"
  mkdir -p "$out/checkpoints"
  cp -r "$dir/$from/checkpoints/step-00000005" "$out/checkpoints/"
  # Loaded at step 5 with nothing to train: the run saves it again at its own layout.
  run "$to" "$out" --steps 5 --resume > "$out.load.log" 2>&1 || { fail "$from -> $to: load: $(tail -n 3 "$out.load.log")"; continue; }
  cp -r "$out/checkpoints/step-00000005" "$out/resaved"
  run "$to" "$out" --steps 15 --resume > "$out.log" 2>&1 || { fail "$from -> $to: 10 more steps: $(tail -n 3 "$out.log")"; continue; }
  python3 - "$dir" "$from" "$to" <<'PY' || fail "$from -> $to: outside the bounds (row above)"
import json, os, sys
sys.path.insert(0, os.environ["TESTS_DIST"])
from sharded_checkpoint import logical
d, src, dst = sys.argv[1:]
a, meta_a = logical(f"{d}/{src}/checkpoints/step-00000005")
b, meta_b = logical(f"{d}/{src}-to-{dst}/resaved")
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
differ = [k for k in a if a[k].tobytes() != b[k].tobytes()]
assert meta_a["step"] == meta_b["step"] == "5" and meta_a["optimizer_steps"] == meta_b["optimizer_steps"]
losses = lambda n: [json.loads(l)["loss"] for l in open(f"{d}/{n}/metrics.jsonl") if '"loss"' in l]
moved, there = losses(f"{src}-to-{dst}"), losses(dst)[5:]
assert len(moved) == len(there) == 10, (len(moved), len(there))
worst = max(abs(x - y) / abs(y) for x, y in zip(moved, there))
ok = not differ and worst <= 1e-6
print(f"| {src} | {dst} | {len(a)} | {'yes' if not differ else 'NO: ' + ', '.join(differ[:3])} | {worst:.2e} |")
sys.exit(0 if ok else 1)
PY
done

# `loom export --hf` of a sharded checkpoint (tp 2 x pipeline 2, 4 processes' shards) writes
# the whole model: each tensor bitwise the checkpoint's.
trained tp2xpp2
"$loom" export --hf "$dir/tp2xpp2/checkpoint" "$dir/hf" > "$dir/export.log" 2>&1 || fail "export --hf: $(tail -n 3 "$dir/export.log")"
python3 - "$dir" <<'PY' || fail "export --hf of a sharded checkpoint (above)"
import os, sys
sys.path.insert(0, os.environ["TESTS_DIST"])
from sharded_checkpoint import logical, safetensors
d = sys.argv[1]
saved, _ = logical(f"{d}/tp2xpp2/checkpoint")
exported = safetensors(f"{d}/hf/model.safetensors")
weights = {k: v for k, v in saved.items() if not k.startswith("optimizer.")}
assert set(exported) == set(weights), sorted(set(exported) ^ set(weights))
assert all(exported[k].tobytes() == weights[k].tobytes() for k in weights)
print(f"export --hf of a sharded checkpoint: {len(weights)} tensors, bitwise")
PY

# --- Background saves under kill -9 and SIGTERM (2 processes, a checkpoint every step) ---
# Each trial starts (or resumes, --auto_resume) the job, lets it log a random 1-4 more steps,
# waits a random 0-8 ms (a background write is in flight at most instants) and kills the
# job's processes with SIGKILL. The checkpoint link must always
# name a complete checkpoint; run to the end, the job logs each step once with the
# uninterrupted run's losses and ends at its final loss.
tiny=(--model llama --layers 1 --width 32 --heads 2 --kv_heads 1 --context 16 --batch 4 --steps 100
  --eval_every 0 --final_eval false --progress false --threads 1 --log_every 100000 --json
  --checkpoint_format sharded --ckpt_every 1)
mpi2=("$mpiexec" -np 2 --oversubscribe --bind-to none -x OMP_WAIT_POLICY -x LOOM_TEST_HOLD_AT_STEP)
export LOOM_TEST_HOLD_AT_STEP=""
"${mpi2[@]}" "$loom" train "${tiny[@]}" --save false --out "$dir/kill-ref" > "$dir/kill-ref.log" 2>&1 \
  || fail "kill reference: $(tail -n 3 "$dir/kill-ref.log")"
final() { grep '^{"steps"' "$1" | tail -n 1 | python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["loss_last"]))'; }
logged() {
  local n=0
  [[ -f "$1/metrics.jsonl" ]] && n=$(grep -c '"loss"' "$1/metrics.jsonl")
  echo "${n:-0}"
}
trials=20
[[ "$mode" == "quick" ]] && trials=5
RANDOM=11
out="$dir/killed" interrupted=0
for ((k = 1; k <= trials; k++)); do
  target=$(( $(logged "$out") + RANDOM % 4 + 1 ))
  "${mpi2[@]}" "$loom" train "${tiny[@]}" --auto_resume --out "$out" > "$dir/kill-$k.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && (( $(logged "$out") < target )); do sleep 0.002; done
  sleep "0.00$(( RANDOM % 9 ))"
  # Every process of the job at once (a machine lost; the launcher's teardown after one
  # rank's death takes seconds), the ranks first so none outlives the launcher.
  victims=($(pgrep -P "$pid" -f "loom train"))
  if (( ${#victims[@]} > 0 )) && kill -KILL "${victims[@]}" 2>/dev/null; then
    interrupted=$((interrupted + 1))
  fi
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [[ -e "$out/checkpoint" && ! -f "$out/checkpoint/index.json" ]]; then
    fail "kill $k: OUT/checkpoint names an incomplete checkpoint"
  fi
done
"${mpi2[@]}" "$loom" train "${tiny[@]}" --auto_resume --out "$out" > "$dir/kill-end.log" 2>&1 || fail "after the kills: $(tail -n 3 "$dir/kill-end.log")"
(( interrupted * 2 >= trials )) || fail "only $interrupted of $trials kills interrupted a run"
[[ "$(final "$dir/kill-end.log")" == "$(final "$dir/kill-ref.log")" ]] ||
  fail "after $trials kill -9: final loss $(final "$dir/kill-end.log"), uninterrupted $(final "$dir/kill-ref.log")"
ls -a "$out/checkpoints" | grep -q '^\.writing' && fail "a temporary checkpoint folder was left behind"
# SIGTERM while the job holds after step 20 (a background save of step 19 or 20 in flight):
# the save finishes, the last checkpoint is step 20's, the job exits 75 (preempted).
LOOM_TEST_HOLD_AT_STEP=20 "${mpi2[@]}" "$loom" train "${tiny[@]}" --out "$dir/term" > "$dir/term.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null && (( $(logged "$dir/term") < 20 )); do sleep 0.01; done
ranks=($(pgrep -P "$pid" -f "loom train"))  # one rank hears it; the job agrees on the stop
kill -TERM "${ranks[-1]}"
wait "$pid"
rc=$?
[[ $rc -eq 75 && "$(readlink "$dir/term/checkpoint")" == *step-00000020 && -f "$dir/term/checkpoint/index.json" ]] ||
  fail "SIGTERM during background saves: exit $rc, checkpoint $(readlink "$dir/term/checkpoint")"
"${mpi2[@]}" "$loom" train "${tiny[@]}" --resume --out "$dir/term" > "$dir/term2.log" 2>&1 || fail "resume after SIGTERM: $(tail -n 3 "$dir/term2.log")"
python3 - "$dir" <<'PY' || fail "metrics after kill -9 or SIGTERM differ (above)"
import json, sys
d = sys.argv[1]
def losses(n):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(f"{d}/{n}/metrics.jsonl")) if "loss" in r]
ref = losses("kill-ref")
assert [s for s, _ in ref] == list(range(1, 101))
assert losses("killed") == ref, "after kill -9: the steps or losses differ from the uninterrupted run"
assert losses("term") == ref, "after SIGTERM: the steps or losses differ from the uninterrupted run"
print("background saves: kill -9 and SIGTERM runs end with the uninterrupted run's 100 losses")
PY
echo "background saves: $interrupted of $trials kill -9 interrupted the job"

# A layout the checkpoint cannot load at is named before training (4 heads over 8 ranks).
out=$("$mpiexec" -np 8 --oversubscribe --bind-to none "$loom" train "${model[@]}" "${base[@]}" --tp 8 \
  --steps 15 --resume --out "$dir/one" 2>&1); rc=$?
[[ $rc -ne 0 && "$out" == *"num_attention_heads = 4 does not divide"* ]] \
  || fail "tp 8 of a 4-head model: rc $rc: $(echo "$out" | grep -v '^\[' | head -n 3)"

echo "$failures failed"
[[ $failures -eq 0 ]]
