#!/usr/bin/env bash
# Parallel layouts against one process (docs/parallel.md, "What the tests check"): each layout
# of tensor (tp), pipeline (pipeline, uneven `stages`) and data parallelism trains a small
# grouped-query Llama-family model 20 steps; its losses must be within 1e-6 relative of one
# process's, its validation estimates too, and the gradients of step 1, gathered whole
# (LOOM_TEST_GRADIENTS), within 1e-5 (max |a-b| over max |b|, per parameter). A tensor- and
# pipeline-parallel run interrupted half-way resumes exactly; ZeRO-1 is bitwise the run without
# it; layouts that cannot run are refused by name.
#
# Usage: test_layouts.sh MPIEXEC path/to/loom [suite|quick|all] [STEPS]
#   suite  the layouts of 2 and 4 processes below (the test suite's)
#   quick  the suite with a third of its layouts, one of each kind (the sanitizer build's)
#   all    every (tp, pipeline, dp) with product 2, 4 or 8 on a model of 8 layers, 8 heads
#          and 4 key/value heads; those the model does not admit are listed with the reason
#          Loom gives; prints a Markdown table for bench/RESULTS.md (`make layouts`)
set -u
mpiexec="$1" loom="$2" mode="${3:-suite}"
export STEPS="${4:-20}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"  # as test_data_parallel.sh
# Ranks outnumber the cores: OpenMP threads that sleep when idle (docs/parallel.md).
export OMP_WAIT_POLICY=PASSIVE
base=(--steps "$STEPS" --final_eval false --progress false --json --threads 1 --ckpt_every 0
  --eval_every 10 --eval_batches 2)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# name -> model flags
declare -A models=(
  [llama]="--model llama --layers 4 --width 64 --heads 4 --kv_heads 2 --context 32 --batch 8"
  [qwen2]="--model qwen2 --layers 4 --width 64 --heads 4 --kv_heads 2 --context 32 --batch 8 --data random --vocab 64 --tie_embeddings true"
  [gpt]="--model gpt --layers 4 --width 64 --heads 4 --context 32 --batch 8"
  [wide]="--model llama --layers 8 --width 64 --heads 8 --kv_heads 4 --context 32 --batch 16"
)

# Runs layout NAME of MODEL on NP processes with FLAGS...; its files are $dir/NAME*.
run() {
  local name="$1" model="$2" np="$3"
  shift 3
  # shellcheck disable=SC2086  # the model's flags split into words
  if [[ "$np" -eq 1 ]]; then
    LOOM_TEST_GRADIENTS="$dir/$name.grads" "$loom" train ${models[$model]} "${base[@]}" "$@" \
      --out "$dir/$name" > "$dir/$name.log" 2>&1
  else
    LOOM_TEST_GRADIENTS="$dir/$name.grads" "$mpiexec" -np "$np" --oversubscribe --bind-to none \
      -x LOOM_TEST_GRADIENTS -x OMP_WAIT_POLICY "$loom" train ${models[$model]} "${base[@]}" "$@" \
      --out "$dir/$name" > "$dir/$name.log" 2>&1
  fi
}

# Compares layout NAME with reference REF (losses, estimates, gradients); prints a table row.
compare() {
  python3 - "$dir" "$1" "$2" "$3" <<'PY'
import json, struct, sys
from array import array
d, ref, name, label = sys.argv[1:]
def records(n):
    return [json.loads(l) for l in open(f"{d}/{n}/metrics.jsonl")]
def series(n, key):
    return [r[key] for r in records(n) if key in r]
def tensors(n):
    with open(f"{d}/{n}.grads", "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = array("f", data[a:b])
    return out
def worst_rel(xs, ys):
    assert len(xs) == len(ys) and xs, (len(xs), len(ys))
    return max(abs(a - b) / abs(a) for a, b in zip(xs, ys))
loss = worst_rel(series(ref, "loss"), series(name, "loss"))
val = worst_rel(series(ref, "val_loss_estimate"), series(name, "val_loss_estimate"))
g1, g2 = tensors(ref), tensors(name)
assert g1.keys() == g2.keys(), sorted(set(g1) ^ set(g2))
grad = 0.0
for k in g1:
    scale = max(abs(x) for x in g1[k]) or 1.0
    grad = max(grad, max(abs(a - b) for a, b in zip(g1[k], g2[k])) / scale)
ok = loss <= 1e-6 and val <= 1e-6 and grad <= 1e-5
print(f"| {label} | {loss:.2e} | {val:.2e} | {grad:.2e} | {'yes' if ok else 'NO'} |")
sys.exit(0 if ok else 1)
PY
}

header() {
  echo "| layout | worst loss rel. diff (${STEPS} steps) | worst val. estimate rel. diff | worst gradient diff, step 1 | within bounds |"
  echo "|---|---|---|---|---|"
}

if [[ "$mode" == "suite" || "$mode" == "quick" ]]; then
  for model in llama qwen2 gpt; do
    run "$model-one" "$model" 1 || fail "$model, one process: $(tail -n 3 "$dir/$model-one.log")"
  done
  # name model processes flags...
  layouts=(
    "dp2 llama 2"
    "dp2-zero llama 2 --zero 1"
    "dp4 llama 4"
    "tp2 llama 2 --tp 2"
    "tp2-vocab qwen2 2 --tp 2"
    "tp2-sp llama 2 --tp 2 --sequence_parallel"
    "tp2-sp-vocab qwen2 2 --tp 2 --sequence_parallel"
    "tp2xdp2 llama 4 --tp 2"
    "tp4-kv-held-twice llama 4 --tp 4"
    "tp2xdp2-sp-zero llama 4 --tp 2 --sequence_parallel --zero 1"
    "tp2xdp2-zero llama 4 --tp 2 --zero 1"
    "pp2 llama 2 --pipeline 2"
    "pp2-uneven llama 2 --pipeline 2 --stages 1,3"
    "pp2-gpipe llama 2 --pipeline 2 --stages 3,1 --micro_batches 4 --pipeline_schedule gpipe"
    "pp2-tied qwen2 2 --pipeline 2 --stages 3,1"
    "pp2-gpt gpt 2 --pipeline 2 --stages 1,3"
    "pp4 llama 4 --pipeline 4"
    "pp2xdp2-uneven llama 4 --pipeline 2 --stages 1,3"
    "pp2xdp2-uneven-zero llama 4 --pipeline 2 --stages 1,3 --zero 1"
    "tp2xpp2 llama 4 --tp 2 --pipeline 2"
    "tp2xpp2-uneven llama 4 --tp 2 --pipeline 2 --stages 3,1 --micro_batches 4"
    "tp2xpp2-vocab qwen2 4 --tp 2 --pipeline 2"
  )
  # One of each kind of code path, for the slow sanitizer build.
  quick=" dp2-zero tp4-kv-held-twice tp2-sp-vocab tp2xdp2-sp-zero pp2-tied pp2xdp2-uneven-zero tp2xpp2 tp2xpp2-uneven "
  header
  for entry in "${layouts[@]}"; do
    read -r name model np flags <<< "$entry"
    [[ "$mode" == "quick" && "$quick" != *" $name "* ]] && continue
    # shellcheck disable=SC2086
    if run "$name" "$model" "$np" $flags; then
      compare "$model-one" "$name" "$name ($np processes: ${flags:-data parallel})" || fail "$name: outside the bounds (row above)"
    else
      fail "$name: $(tail -n 3 "$dir/$name.log")"
    fi
  done
  # Interrupted half-way and resumed: bitwise the uninterrupted run's losses.
  half=$((STEPS / 2))
  run tp2xpp2-r llama 4 --tp 2 --pipeline 2 --stop_after "$half" \
    || fail "tp2xpp2 stop_after: $(tail -n 3 "$dir/tp2xpp2-r.log")"
  mv "$dir/tp2xpp2-r.log" "$dir/tp2xpp2-r1.log"
  run tp2xpp2-r llama 4 --tp 2 --pipeline 2 --resume || fail "tp2xpp2 resume: $(tail -n 3 "$dir/tp2xpp2-r.log")"
  python3 - "$dir" <<'PY' || fail "resumed or ZeRO-1 numbers differ (above)"
import json, os, sys
d = sys.argv[1]
losses = lambda n: [json.loads(l)["loss"] for l in open(f"{d}/{n}/metrics.jsonl") if '"loss"' in l]
assert losses("tp2xpp2-r") == losses("tp2xpp2"), (losses("tp2xpp2-r"), losses("tp2xpp2"))
print("tp 2 x pipeline 2: resumed at step", len(losses("tp2xpp2")) // 2, "- bitwise the same losses")
# ZeRO-1 shards the optimizer state, not the arithmetic: bitwise the numbers without it.
checked = [p for p in ("dp2", "tp2xdp2", "pp2xdp2-uneven")
           if os.path.exists(f"{d}/{p}/metrics.jsonl")]  # none in the quick run
for plain in checked:
    assert losses(plain + "-zero") == losses(plain), f"zero 1 changes the {plain} numbers"
if checked:
    print("ZeRO-1: bitwise the losses without it:", ", ".join(checked))
# The summary accounts for each kind of collective per step, and each rank's peak memory:
# tensor parallelism all-reduces; with sequence parallelism, all-gathers and reduce-scatters
# take the blocks' place; the distributed optimizer reduce-scatters and all-gathers.
def summary(n):
    return json.loads([l for l in open(f"{d}/{n}.log") if l.startswith('{"steps"')][-1])
for name, kinds in (("tp2", {"all_reduce"}), ("tp2-sp", {"all_reduce", "all_gather", "reduce_scatter"}),
                    ("tp2-sp-vocab", {"all_reduce", "all_gather", "reduce_scatter"}),
                    ("dp2-zero", {"all_reduce", "all_gather", "reduce_scatter"}),
                    ("pp2-tied", {"all_reduce", "point_to_point"})):
    if not os.path.exists(f"{d}/{name}.log"):
        continue
    s = summary(name)
    assert set(s["collectives_per_step"]) == kinds, (name, s["collectives_per_step"])
    assert len(s["peak_rss_bytes_per_rank"]) == s["layout"]["tp"] * s["layout"]["pp"] * s["layout"]["dp"], name
    print(f"{name}: per step", {k: round(v["calls"], 1) for k, v in s["collectives_per_step"].items()})
PY
  # Layouts that cannot run are named before training.
  refuse() {
    local want="$1"
    shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    [[ $rc -ne 0 && "$out" == *"$want"* ]] || fail "expected a refusal naming '$want': rc $rc: $(echo "$out" | head -n 3)"
  }
  mpi2=("$mpiexec" -np 2 --oversubscribe --bind-to none "$loom" train --steps 1 --out "$dir/bad")
  # shellcheck disable=SC2086
  refuse "stages = 1,2: the counts sum to 3, the model has 4 layers" "${mpi2[@]}" ${models[llama]} --pipeline 2 --stages 1,2
  refuse "stages = '4': 1 block counts for pipeline = 2" "${mpi2[@]}" --pipeline 2 --stages 4
  refuse "stages = '2,x'" "${mpi2[@]}" --pipeline 2 --stages 2,x
  refuse "2 stages need at least as many layers, got 1" "${mpi2[@]}" --layers 1 --pipeline 2
  refuse "tp = 2 x pipeline = 2 needs a multiple of 4 processes" "${mpi2[@]}" --model llama --tp 2 --pipeline 2
  refuse "batch = 6 does not divide into micro_batches = 4" "${mpi2[@]}" --pipeline 2 --micro_batches 4 --batch 6
  refuse "num_attention_heads = 3 does not divide" "${mpi2[@]}" --model llama --width 48 --heads 3 --kv_heads 1 --tp 2
  refuse "sequence_parallel: shards the residual stream over tensor-parallel ranks; give --tp" "${mpi2[@]}" --model llama --sequence_parallel
  refuse "sequence_parallel with pipeline = 2" "$mpiexec" -np 4 --oversubscribe --bind-to none "$loom" train --steps 1 --out "$dir/bad" --model llama --tp 2 --pipeline 2 --sequence_parallel
  refuse "the 31 rows of the residual stream (batch x sequence) do not divide among 2" "${mpi2[@]}" --model llama --tp 2 --sequence_parallel --batch 1 --context 31

  # One rank failing alone (rank 0 cannot write the gradient file, its peer goes on to the next
  # step's collectives) ends the whole job at once, the error named: the failing rank aborts
  # the job rather than waiting at exit for peers that wait for it.
  SECONDS=0
  out=$(LOOM_TEST_GRADIENTS="$dir/no/such/folder/g" timeout 120 "$mpiexec" -np 2 --oversubscribe --bind-to none \
    -x LOOM_TEST_GRADIENTS "$loom" train --model llama --layers 2 --steps 1000 --threads 1 --out "$dir/lone" 2>&1); rc=$?
  [[ $rc -ne 0 && $rc -ne 124 && $SECONDS -lt 60 && "$out" == *"cannot create temporary file"* ]] \
    || fail "one failing rank: rc $rc after $SECONDS s: $(echo "$out" | grep -v '^step' | head -n 3)"
  echo "one failing rank: the job ended after $SECONDS s (exit $rc)"

  # The planner's layout runs: `loom plan --engine --json` (only layouts loom train runs) for
  # the llama above on 4 chips, its first line piped into `loom train --layout -` on 4
  # processes: the layout the summary reports is the plan's, the losses one process's.
  plan=("$loom" plan --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 192 --vocab 65 --gated
    --chip h100-sxm --chips 4 --seq 32 --global-batch 8 --engine --json --top 1)
  "${plan[@]}" > "$dir/plan.json" 2> "$dir/plan.log" || fail "loom plan --engine: $(tail -n 3 "$dir/plan.log")"
  # shellcheck disable=SC2086
  "$mpiexec" -np 4 --oversubscribe --bind-to none -x LOOM_TEST_GRADIENTS="$dir/planned.grads" -x OMP_WAIT_POLICY \
    "$loom" train ${models[llama]} "${base[@]}" --layout - --out "$dir/planned" < "$dir/plan.json" > "$dir/planned.log" 2>&1 \
    || fail "loom train --layout -: $(tail -n 3 "$dir/planned.log")"
  compare llama-one planned "the plan's layout ($(head -c 120 "$dir/plan.json")...)" || fail "the planned layout: outside the bounds"
  python3 - "$dir" <<'PY' || fail "the run's layout is not the plan's (above)"
import json, sys
d = sys.argv[1]
plan = json.loads(open(f"{d}/plan.json").readline())
summary = json.loads([l for l in open(f"{d}/planned.log") if l.startswith('{"steps"')][-1])
ran = summary["layout"]
want = {"tp": plan["tp"], "pp": plan["pp"], "dp": plan["dp"], "zero": plan["zero"],
        "micro_batches": plan["global_batch"] // (plan["dp"] * plan["micro_batch"]) if plan["pp"] > 1 else 1,
        "stage_blocks": plan["stage_layers"] if plan["pp"] > 1 else []}
assert ran == want, (ran, want)
print("planned layout ran:", ran)
PY
  # Layouts loom train does not run, refused by name (a plan without --engine may hold them).
  line() {  # a plan line with FIELD=VALUE pairs changed
    python3 -c 'import json, sys
j = json.loads(open(sys.argv[1]).readline())
for kv in sys.argv[2:]:
    k, v = kv.split("=")
    j[k] = json.loads(v)
print(json.dumps(j))' "$dir/plan.json" "$@"
  }
  mpi4=("$mpiexec" -np 4 --oversubscribe --bind-to none "$loom" train --model llama --layers 4 --heads 4 --kv_heads 2 --steps 1 --out "$dir/bad" --layout)
  line ep=2 > "$dir/l1.json"; refuse "ep = 2: expert parallelism is not built" "${mpi4[@]}" "$dir/l1.json"
  line zero=2 > "$dir/l2.json"; refuse "zero = 2: ZeRO stages 2 and 3 are not built" "${mpi4[@]}" "$dir/l2.json"
  line recompute='"full"' > "$dir/l3.json"; refuse "recompute = full: activation recomputation is not built" "${mpi4[@]}" "$dir/l3.json"
  line tp=2 pp=2 dp=1 micro_batch=2 > "$dir/l4.json"; refuse "tp = 2: the model's 3 key/value heads do not divide among the ranks, nor the ranks among the heads" "${mpi4[@]:0:8}" --model llama --layers 4 --width 96 --heads 6 --kv_heads 3 --steps 1 --out "$dir/bad" --layout "$dir/l4.json"
  line interleave=2 > "$dir/l5.json"; refuse "interleave = 2: the interleaved pipeline schedule" "${mpi4[@]}" "$dir/l5.json"
  line tp=1 pp=1 dp=2 > "$dir/l6.json"; refuse "tp 1 x pp 1 x dp 2 is 2 processes, this job has 4" "${mpi4[@]}" "$dir/l6.json"
  refuse "batch = 8 in the layout, but the run sets batch = 16" "${mpi4[@]}" "$dir/plan.json" --batch 16
  echo '{"pp": 2}' > "$dir/l7.json"; refuse "field 'tp' is missing" "${mpi4[@]}" "$dir/l7.json"
else
  header
  for n in 2 4 8; do
    for tp in 1 2 4 8; do
      for pp in 1 2 4 8; do
        (( n % (tp * pp) == 0 )) || continue
        dp=$((n / (tp * pp)))
        name="tp${tp}-pp${pp}-dp${dp}"
        [[ -f "$dir/wide-one.grads" ]] || run wide-one wide 1 || fail "one process: $(tail -n 3 "$dir/wide-one.log")"
        if run "$name" wide "$n" --tp "$tp" --pipeline "$pp"; then
          compare wide-one "$name" "tp $tp x pipeline $pp x dp $dp" || fail "$name: outside the bounds"
        else
          reason=$(grep -m1 -o "loom: .*" "$dir/$name.log" | cut -c7- | head -c 160)
          echo "| tp $tp x pipeline $pp x dp $dp | not admitted: ${reason:-$(tail -n 1 "$dir/$name.log")} | | | |"
        fi
      done
    done
  done
fi
echo "$failures failed"
exit $((failures > 0))
