#!/usr/bin/env bash
# `loom train` ready to be scheduled (docs/fleet.md):
#  - SIGTERM makes a run checkpoint at the next step boundary and exit 75 (preempted,
#    resumable); resumed, it reproduces the uninterrupted run exactly, and metrics.jsonl
#    holds each step once;
#  - a run resumes on another backend (cpu -> opencl -> partial) from the same step;
#  - kill -9 at random instants while checkpointing every step always leaves a complete
#    checkpoint: restarted with --auto_resume after each kill, the run ends exactly where
#    the uninterrupted one does;
#  - two processes (MPI) agree on the stop step.
# Usage: test_preempt.sh path/to/loom [MPIEXEC]
set -u
loom="$1" mpiexec="${2:-}"
dir=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$dir"' EXIT; echo "dir: $dir"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
steps=400
shape=(--layers 1 --width 32 --heads 2 --context 16 --batch 4 --eval_every 0 --final_eval false
       --progress false --threads 1 --log_every 100000 --json)
common=("${shape[@]}" --steps "$steps")

# Waits until the run writing $1/metrics.jsonl has logged at least $2 steps; fails at once
# when process $3 has ended first, and after 300 s (a slow sanitizer build is still well
# inside it).
# The SIGTERM checks start their run with LOOM_TEST_HOLD_AT_STEP=N: the run holds after
# logging step N until a stop signal comes, so the signal lands mid-run however fast the
# machine is (a 400-step run of this shape takes a fraction of a second on a fast CPU,
# and without the hold could end before the signal arrives).
wait_for_steps() {
  local deadline=$((SECONDS + 300))
  while (( SECONDS < deadline )); do
    [[ -f "$1/metrics.jsonl" ]] && (( $(grep -c '"loss"' "$1/metrics.jsonl") >= $2 )) && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}
last_loss() { tail -n 1 "$1" | python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["loss_last"]))'; }

"$loom" train "${common[@]}" --out "$dir/ref" > "$dir/ref.log" 2>&1 || fail "reference run: $(tail -n 3 "$dir/ref.log")"
ref=$(last_loss "$dir/ref.log")

# --- SIGTERM, then resume on the same backend: exact --------------------------------
LOOM_TEST_HOLD_AT_STEP=50 "$loom" train "${common[@]}" --out "$dir/term" > "$dir/term1.log" 2>&1 &
pid=$!
wait_for_steps "$dir/term" 50 "$pid" || fail "the run did not reach step 50: $(tail -n 3 "$dir/term1.log")"
kill -TERM "$pid"
wait "$pid"
rc=$?
[[ $rc -eq 75 ]] || fail "SIGTERM: exit status $rc, expected 75; $(tail -n 3 "$dir/term1.log")"
grep -q '"preempted":true' "$dir/term1.log" || fail "the JSON summary does not say preempted"
held=$(grep -c '"loss"' "$dir/term/metrics.jsonl")
[[ $held == 50 ]] || fail "held at step 50 and signalled there, the run logged $held steps"
[[ -L "$dir/term/checkpoint" && -f "$dir/term/checkpoint/model.safetensors" ]] ||
  fail "no published checkpoint after SIGTERM"
"$loom" train "${common[@]}" --out "$dir/term" --resume > "$dir/term2.log" 2>&1 || fail "resume: $(tail -n 3 "$dir/term2.log")"
[[ "$(last_loss "$dir/term2.log")" == "$ref" ]] ||
  fail "resumed after SIGTERM: final loss $(last_loss "$dir/term2.log"), uninterrupted $ref"
python3 - "$dir/ref/metrics.jsonl" "$dir/term/metrics.jsonl" "$steps" <<'PY' || fail "metrics.jsonl after a resume (above)"
import json, sys
ref, got, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(path)) if "loss" in r]
a, b = losses(ref), losses(got)
assert [s for s, _ in b] == list(range(1, steps + 1)), "steps not each logged once"
assert a == b, "losses differ from the uninterrupted run's"
PY
[[ -f "$dir/term/checkpoint/model.safetensors" ]] || fail "no checkpoint at the end"
"$loom" sample "$dir/term/checkpoint" --prompt "a" --tokens 3 > /dev/null 2>&1 ||
  fail "loom sample does not read OUT/checkpoint"

# --- another backend on each resume ---------------------------------------------------
backends=(cpu)
for b in opencl partial; do
  "$loom" train "${shape[@]}" --steps 1 --save false --device "$b" --out "$dir/probe-$b" > /dev/null 2>&1 && backends+=("$b")
done
if (( ${#backends[@]} < 2 )); then
  echo "note: only the cpu backend is available; the cross-backend resume is not checked"
else
  out="$dir/moving"
  at=0
  for i in "${!backends[@]}"; do
    b=${backends[$i]}
    resume=(); (( i > 0 )) && resume=(--resume)
    if (( i + 1 < ${#backends[@]} )); then
      LOOM_TEST_HOLD_AT_STEP=$(( at + 40 )) "$loom" train "${common[@]}" --device "$b" --out "$out" "${resume[@]}" > "$dir/moving-$b.log" 2>&1 &
      pid=$!
      wait_for_steps "$out" $(( at + 40 )) "$pid" || fail "$b: did not reach step $(( at + 40 )): $(tail -n 3 "$dir/moving-$b.log")"
      kill -TERM "$pid"
      wait "$pid"
      rc=$?
      [[ $rc -eq 75 ]] || fail "$b: exit status $rc after SIGTERM, expected 75"
      next=$(grep -c '"loss"' "$out/metrics.jsonl")
      (( next == at + 40 )) || fail "$b: held at step $(( at + 40 )) and stopped, but $next steps are logged"
      at=$next
    else
      "$loom" train "${common[@]}" --device "$b" --out "$out" --resume > "$dir/moving-$b.log" 2>&1 || fail "$b: $(tail -n 3 "$dir/moving-$b.log")"
      (( $(grep -c '"loss"' "$out/metrics.jsonl") == steps )) ||
        fail "$b: resumed at step $at, but the run did not end with each of its $steps steps logged once"
    fi
  done
  python3 - "$(last_loss "$dir/moving-${backends[-1]}.log")" "$ref" "${backends[*]}" <<'PY' || fail "cross-backend resume (above)"
import sys
got, ref = float(sys.argv[1]), float(sys.argv[2])
rel = abs(got - ref) / abs(ref)
print(f"resumed across {sys.argv[3]}: final loss {got:.6f}, uninterrupted cpu run {ref:.6f}, relative difference {rel:.2e}")
assert rel < 1e-3, rel
PY
fi

# --- kill -9 at random instants, checkpointing every step -----------------------------
# Each kill lands a random 1-20 steps into the run, then 0-8 ms later (a checkpoint write
# is in flight at most instants), so it interrupts the run however fast the machine is.
out="$dir/killed"
RANDOM=7
logged() {  # steps in metrics.jsonl so far (grep -c prints 0, and fails, when none)
  local n=0
  [[ -f "$out/metrics.jsonl" ]] && n=$(grep -c '"loss"' "$out/metrics.jsonl")
  echo "${n:-0}"
}
interrupted=0
for kill in 1 2 3 4 5 6; do
  target=$(( $(logged) + RANDOM % 20 + 1 ))
  "$loom" train "${common[@]}" --ckpt_every 1 --auto_resume --out "$out" > "$dir/kill-$kill.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && (( $(logged) < target )); do sleep 0.002; done
  sleep "0.00$(( RANDOM % 9 ))"
  kill -KILL "$pid" 2>/dev/null && interrupted=$((interrupted + 1))
  wait "$pid" 2>/dev/null
  if [[ -e "$out/checkpoint" && ! -f "$out/checkpoint/train_state.safetensors" ]]; then
    fail "kill $kill: OUT/checkpoint is incomplete"
  fi
done
"$loom" train "${common[@]}" --ckpt_every 1 --auto_resume --out "$out" > "$dir/kill-end.log" 2>&1 || fail "after the kills: $(tail -n 3 "$dir/kill-end.log")"
# Resumed once more, the finished run has no step left: it reports the losses logged at
# its last step, not zeros.
"$loom" train "${common[@]}" --ckpt_every 1 --auto_resume --out "$out" > "$dir/kill-again.log" 2>&1 || fail "resuming a finished run: $(tail -n 3 "$dir/kill-again.log")"
[[ "$(last_loss "$dir/kill-again.log")" == "$ref" ]] ||
  fail "a finished run resumed: loss_last $(last_loss "$dir/kill-again.log"), expected $ref"
(( interrupted >= 4 )) || fail "only $interrupted of 6 kills interrupted a run: the kill -9 check checked little"
[[ "$(last_loss "$dir/kill-end.log")" == "$ref" ]] ||
  fail "after 6 kill -9: final loss $(last_loss "$dir/kill-end.log"), uninterrupted $ref"
python3 - "$dir/ref/metrics.jsonl" "$out/metrics.jsonl" "$steps" <<'PY' || fail "metrics.jsonl after kill -9 (above)"
import json, sys
def losses(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(path)) if "loss" in r]
assert losses(sys.argv[1]) == losses(sys.argv[2])
PY
kept=$(ls -d "$out"/checkpoints/step-* | wc -l)
[[ $kept -eq 2 ]] || fail "expected the 2 newest checkpoints kept, found $kept"
ls -a "$out/checkpoints" | grep -q '^\.writing' && fail "a temporary checkpoint folder was left behind"

# --- two processes agree on the stop step ----------------------------------------------
if [[ -n "$mpiexec" ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  LOOM_TEST_HOLD_AT_STEP=30 "$mpiexec" -x LOOM_TEST_HOLD_AT_STEP -np 2 --oversubscribe --bind-to none \
    "$loom" train "${common[@]}" --out "$dir/mpi" > "$dir/mpi.log" 2>&1 &
  pid=$!
  wait_for_steps "$dir/mpi" 30 "$pid" || fail "mpi: did not reach step 30: $(tail -n 3 "$dir/mpi.log")"
  # One rank only hears the signal; both must stop after the same step and checkpoint.
  # The ranks are the processes whose own name is loom's: mpiexec's command line matches
  # the same pattern, and PIDs may wrap, so neither the order nor the pattern alone
  # tells a rank from the launcher.
  rank1=""
  for p in $(pgrep -f "train.*$dir/mpi"); do
    [[ $p != "$pid" && "$(cat "/proc/$p/comm" 2>/dev/null)" == "$(basename "$loom" | cut -c1-15)" ]] && rank1=$p
  done
  [[ -n "$rank1" ]] || fail "mpi: no rank process found"
  kill -TERM "$rank1"
  wait "$pid"
  rc=$?
  [[ $rc -eq 75 ]] || fail "mpi: exit status $rc after SIGTERM to one rank, expected 75; $(tail -n 5 "$dir/mpi.log")"
  "$mpiexec" -np 2 --oversubscribe --bind-to none "$loom" train "${common[@]}" --out "$dir/mpi" --resume > "$dir/mpi2.log" 2>&1 ||
    fail "mpi resume: $(tail -n 3 "$dir/mpi2.log")"
fi

if (( failures > 0 )); then
  echo "$failures failure(s)"
  exit 1
fi
echo "preemption and crash-safe checkpoints: all checks passed"
