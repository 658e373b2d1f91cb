#!/usr/bin/env bash
# The loom binary on bad input: a one-line error naming what is wrong, a non-zero exit,
# and no checkpoint left behind. Usage: test_cli.sh path/to/loom
set -u
loom=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

expect_error() {  # expect_error "needle" args...
  local needle="$1"; shift
  local out rc
  out=$("$loom" "$@" 2>&1 >/dev/null); rc=$?
  if [[ $rc -eq 0 ]]; then echo "FAIL: exit 0 for: $*"; failures=$((failures + 1)); return; fi
  if [[ "$out" != *"$needle"* ]]; then echo "FAIL: '$needle' not in: $out"; failures=$((failures + 1)); return; fi
  echo "ok: $*"
}

printf 'lr: [1,\n' > "$dir/bad.yaml"
printf 'lerning_rate: 0.1\n' > "$dir/unknown.yaml"
expect_error "bad.yaml: malformed YAML" train "$dir/bad.yaml" --out "$dir/o1"
expect_error "unknown.yaml: unknown field 'lerning_rate'" train "$dir/unknown.yaml" --out "$dir/o2"
expect_error "field 'steps': value '-5' is out of range" train --steps=-5 --out "$dir/o3"
expect_error "missing.txt: cannot open the data file" train --data "$dir/missing.txt" --out "$dir/o4"
expect_error "no checkpoint to resume from" train --resume --out "$dir/o5"
expect_error "precision: 'bf16' is not supported on device 'partial'" train --device partial --precision bf16 --out "$dir/o6"
expect_error "field 'precision': value 'fp8'" train --precision fp8 --out "$dir/o7"
# Without an NVIDIA driver, --device cuda says why (with one, the CUDA suites cover it),
# with the job contract's "device unavailable" status, 69, that a scheduler reads.
if ! "$loom" ops --backend all 2>/dev/null | grep -q '^cuda:'; then
  expect_error "device 'cuda' is not available" train --device cuda --steps 1 --out "$dir/o8"
  "$loom" train --device cuda --steps 1 --out "$dir/o8b" > /dev/null 2>&1
  rc=$?
  if [[ $rc -eq 69 ]]; then echo "ok: an unavailable device exits 69"
  else echo "FAIL: an unavailable device exited $rc, expected 69"; failures=$((failures + 1)); fi
fi
# The keys loom train offers are exactly the job contract's (core/job_contract.def), which
# the fleet service reads too (JobContract.* in tests/cluster check the service's side).
help_keys=$("$loom" train --help | grep -oE '^  --[a-z0-9_]+' | sed 's/^  --//' | grep -vx help | sort)
contract_keys=$(grep -oE '^LOOM_TRAIN_KEY\([a-z0-9_]+' src/core/job_contract.def | sed 's/^LOOM_TRAIN_KEY(//' | sort)
if [[ -n "$help_keys" && "$help_keys" == "$contract_keys" ]]; then
  echo "ok: loom train --help lists the contract's $(echo "$help_keys" | wc -l) keys"
else
  echo "FAIL: loom train --help and core/job_contract.def differ:"
  diff <(echo "$help_keys") <(echo "$contract_keys")
  failures=$((failures + 1))
fi
expect_error "pipeline = 2 needs a multiple of 2 processes" train --pipeline 2 --steps 1 --out "$dir/o9"
expect_error "field 'pipeline_schedule': value 'zigzag' is not one of: 1f1b, gpipe" train --pipeline_schedule zigzag --out "$dir/o10"
expect_error "field 'zero': value '2' is out of range" train --zero 2 --out "$dir/o11"
printf '? [a, b]\n: 1\n' > "$dir/key.yaml"
expect_error "key.yaml: line 1: a key must be a field name" train "$dir/key.yaml" --out "$dir/o_key"
printf 'garbage' > "$dir/x.safetensors"
expect_error "x.safetensors" sample "$dir/x.safetensors"
expect_error "cannot open" eval "$dir/none.safetensors" --data "$dir/missing.txt"
expect_error "chips 1000 != tp*pp*dp*cp" plan --model llama3-70b --chip h100-sxm --chips 1000 --tp 8 --pp 4 --dp 32
expect_error "unknown chip 'h1000'" plan --model llama3-70b --chip h1000 --chips 8
expect_error "unknown model 'gpt5'" plan --model gpt5 --chip h100-sxm --chips 8
expect_error "stages sum to 81 layers, the model has 80" plan --model llama3-70b --chip h100-sxm --chips 24 --tp 8 --pp 3 --dp 1 --global-batch 8 --micro-batch 1 --recompute full --zero 1 --cp 1 --stages 27,27,27
expect_error "pp 81 is more stages than the 80 layers" plan --model llama3-70b --chip h100-sxm --chips 648 --tp 8 --pp 81 --dp 1 --global-batch 8 --micro-batch 1 --cp 1
expect_error "count 'abc' is not a positive integer" plan --model llama3-70b --compare h100-sxm:abc
# Parallel degrees of 0 were divisions by zero (SIGFPE, no message); now they are named.
expect_error "tp = 0, expected 1..8" plan --model llama3-70b --chip h100-sxm --chips 8 --tp 0
expect_error "pp = 0, expected 1..8" plan --model llama3-70b --chip h100-sxm --chips 8 --pp 0
expect_error "count '99999999999999999999' is not a positive integer" plan --model llama3-70b --compare h100-sxm:99999999999999999999
printf 'runs:\n  - {id: zero, source: x, chip: a100-80gb, chips: 32, heads: 24, hidden: 2304, layers: 24, tp: 0, pp: 1, global_batch: 512, seq: 2048, vocab: 51200, counts: hardware, tflops_per_chip: 137}\n' > "$dir/runs0.yaml"
expect_error "runs0.yaml: run 'zero': field 'tp' is 0, expected a whole number in 1..32" plan --validate "$dir/runs0.yaml"
expect_error "cp = 0, expected 1..8" plan --model llama3-70b --chip h100-sxm --chips 8 --cp 0
sed 's/tp: 0, pp: 1,/tp: 1, pp: 1, cp: 0,/' "$dir/runs0.yaml" > "$dir/runs_cp0.yaml"
expect_error "runs_cp0.yaml: run 'zero': field 'cp' is 0, expected a whole number in 1..32" plan --validate "$dir/runs_cp0.yaml"
# plan --validate fails when the errors exceed the limits given (and passes within them).
runs=catalog/calibration/calibration-runs.yaml
expect_error "calibration-runs.yaml: max |error| 4.0% exceeds --max-error 1 by" plan --validate "$runs" --max-error 1
# A chip with estimated figures is planned as a range, and --compare names every figure's source.
compared=$("$loom" plan --model llama3-405b --compare 910b:16384,b200:8192 --tokens 15T 2>&1)
for needle in "range from estimated figures:" "bf16_tflops          376 [313..414]" "NVIDIA HGX B200 specifications" \
    "attention_efficiency 1                    calibrated on MindSpeed-LLM" \
    "attention_efficiency 0.5                  assumed (no calibrated figure"; do
  if [[ "$compared" != *"$needle"* ]]; then echo "FAIL: '$needle' not in plan --compare output"; failures=$((failures + 1)); fi
done
expect_error "median |error| 1.9% exceeds --max-median-error 0.5 by" plan --validate "$runs" --max-median-error 0.5 --max-error 50
"$loom" plan --validate "$runs" --max-median-error 4 --max-error 5 > /dev/null \
  || { echo "FAIL: plan --validate within its limits"; failures=$((failures + 1)); }
expect_error "--max-error: Value -1 not in range" plan --validate "$runs" --max-error -1
# Leave one source out: in the calibration set the A100 and the 910B have one source each,
# so their runs cannot be held out; the H100 has two (Llama 3, NeMo's long sequences), each
# predicted with gemm_efficiency refitted on the other.
loso=$("$loom" plan --leave-one-source-out "$runs" --json 2>&1)
[[ $(grep -c '"held_out_runs":0,.*"untested":\["' <<< "$loso") -eq 2 ]] \
  && [[ $(grep -c '"source":"llama3","runs":1,.*"held_out_runs":1,' <<< "$loso") -eq 1 ]] \
  && [[ $(grep -c '"source":"nemo2403-longseq","runs":9,.*"held_out_runs":9,' <<< "$loso") -eq 1 ]] \
  || { echo "FAIL: plan --leave-one-source-out on the calibration set: $loso"; failures=$((failures + 1)); }
# A user's measured run recalibrates the chip it ran on, and the change is printed.
printf 'runs:\n  - {id: mine, source: our cluster, chip: a100-80gb, chips: 32, tp: 1, pp: 1, global_batch: 512, seq: 2048, vocab: 51200, heads: 24, hidden: 2304, layers: 24, recompute: full, counts: hardware, tflops_per_chip: 180}\n' > "$dir/measured.yaml"
measured=$("$loom" plan --model gpt3-175b --compare a100-80gb:1024,h100-sxm:1024 --measured "$dir/measured.yaml" 2>&1)
for needle in "a100-80gb: gemm_efficiency 0.750 (catalog) -> 0.61" "fitted on 1 measured run(s) in $dir/measured.yaml" "h100-sxm: no measured run in"; do
  [[ "$measured" == *"$needle"* ]] || { echo "FAIL: '$needle' not in plan --measured output: $measured"; failures=$((failures + 1)); }
done
"$loom" plan --model gpt3-175b --chip a100-80gb --chips 1024 --top 1 --json --measured "$dir/measured.yaml" 2>/dev/null \
  | grep -q '"gemm_efficiency_fit":{"catalog":0.75,"fitted":0.61' \
  || { echo "FAIL: plan --measured --json carries the fit"; failures=$((failures + 1)); }
# --gated: a custom SwiGLU model has three MLP matrices, so more weights per chip than the GELU one.
mlp_mem() { "$loom" plan --layers 8 --hidden 1024 --heads 8 --ffn 4096 --vocab 32000 "$@" --chip h100-sxm --chips 8 --tp 8 --pp 1 --dp 1 --top 1 --json 2>/dev/null | grep -o '"memory_per_chip_gb":[0-9.]*'; }
[[ "$(mlp_mem)" != "$(mlp_mem --gated)" && -n "$(mlp_mem --gated)" ]] \
  || { echo "FAIL: plan --gated plans a different model: $(mlp_mem) vs $(mlp_mem --gated)"; failures=$((failures + 1)); }
both=$("$loom" plan --model llama3-405b --compare 910c:98304,b200:36864 --global-batch 4096 2>/dev/null | grep -c -E '^(910c|b200) ')
[[ $both -eq 2 ]] || { echo "FAIL: --compare with counts printed $both rows"; failures=$((failures + 1)); }
# Days, energy and cost side by side: a price per chip (the 910C has no default), and the
# 910C's energy as a range from its estimated power.
moe=$("$loom" plan --model deepseek-v3 --compare 910c:2048,b200:2048 --price 910c=1.5,b200=4 2>&1)
for needle in "kMWh, \$" "tdp_w                800 [620..800]" "price_per_hour       5 "; do
  [[ "$moe" == *"$needle"* ]] || { echo "FAIL: '$needle' not in plan --compare --price output: $moe"; failures=$((failures + 1)); }
done
[[ $(grep -E '^(910c|b200) ' <<< "$moe" | grep -c unknown) -eq 0 ]] \
  || { echo "FAIL: a priced --compare left energy or cost unknown: $moe"; failures=$((failures + 1)); }
# A chip-hour price of 4 on the B200 costs 4/5 of the catalog's 5.
cost_at() { "$loom" plan --model deepseek-v3 --chip b200 --chips 2048 --top 1 --json "$@" 2>/dev/null | grep -o '"cost_usd":[0-9.e+]*' | cut -d: -f2; }
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a / b - 0.8) > 1e-9)" \
    "$(cost_at --price b200=4)" "$(cost_at)" \
  || { echo "FAIL: --price b200=4 did not price the B200 at 4 USD per chip-hour"; failures=$((failures + 1)); }
expect_error "--price names chip 'h100', which is not planned here (planned: 910c, b200)" plan --model deepseek-v3 --compare 910c:2048,b200:2048 --price h100=2
expect_error "--price b200: 'cheap' is not a price" plan --model deepseek-v3 --compare 910c:2048,b200:2048 --price b200=cheap
expect_error "entry 'b200' is not chip=USD" plan --model deepseek-v3 --compare 910c:2048,b200:2048 --price 910c=1,b200
expect_error "--price: '-1' is not a price" plan --model deepseek-v3 --chip b200 --chips 2048 --price -1
"$loom" ops --model gpt --backend all | grep -q '^partial: .* decomposed, .* fall back' \
  || { echo "FAIL: loom ops prints no summary for the partial backend"; failures=$((failures + 1)); }
"$loom" ops --model gpt --backend cpu --precision bf16 --sync | head -n 1 | grep -q 'bf16 products.*device time per step' \
  || { echo "FAIL: loom ops --precision bf16 --sync"; failures=$((failures + 1)); }
expect_error "partial has no bf16 matmul products" ops --backend partial --precision bf16
# A PyTorch script's coverage report (LOOM_TORCH_REPORT, python/loom_torch): shown as a table
# with fallbacks first; a bad one names the file, the field, its value and what was expected.
cat > "$dir/torch.json" <<'EOF_JSON'
{"schema_version": 1, "torch": "2.15.0", "devices": ["cpu", "opencl"], "ops": [
 {"op": "mm.out", "calls": 4, "native": 4, "decomposed": 0, "loom_fallback": 0, "pytorch_fallback": 0, "seconds": 0.002, "bytes_copied": 0},
 {"op": "isin.Tensor_Tensor_out", "calls": 2, "native": 0, "decomposed": 0, "loom_fallback": 0, "pytorch_fallback": 2, "seconds": 0.001, "bytes_copied": 4000000}]}
EOF_JSON
"$loom" ops --torch_report "$dir/torch.json" > "$dir/torch.txt" 2>&1
{ sed -n 3p "$dir/torch.txt" | grep -q '^isin.Tensor_Tensor_out  *pytorch fallback  *2 .* 4.00$' &&
  sed -n 4p "$dir/torch.txt" | grep -q '^mm.out  *native  *4 ' &&
  grep -q '^2 ATen ops, 6 calls: 1 ops native, 0 by decomposition, 0 through Loom.s CPU fallback, 1 through PyTorch.s (2 calls fell back)$' "$dir/torch.txt"; } \
  || { echo "FAIL: loom ops --torch_report: $(cat "$dir/torch.txt")"; failures=$((failures + 1)); }
"$loom" ops --torch_report "$dir/torch.json" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert [o["path"] for o in r["ops"]] == ["pytorch fallback", "native"], r
assert r["devices"] == ["cpu", "opencl"] and r["torch"] == "2.15.0", r' \
  || { echo "FAIL: loom ops --torch_report --json"; failures=$((failures + 1)); }
printf '{"schema_version": 1, "torch": "2.15.0", "devices": [],' > "$dir/cut.json"
expect_error "cut.json: not JSON" ops --torch_report "$dir/cut.json"
sed 's/"calls": 4,/"calls": 5,/' "$dir/torch.json" > "$dir/sum.json"
expect_error "sum.json: field 'ops[0].calls' is 5, expected the sum of native, decomposed, loom_fallback and pytorch_fallback (4)" ops --torch_report "$dir/sum.json"
sed 's/"seconds": 0.001/"seconds": "fast"/' "$dir/torch.json" > "$dir/seconds.json"
expect_error "seconds.json: field 'ops[1].seconds' is \"fast\", expected a non-negative number" ops --torch_report "$dir/seconds.json"
sed 's/"schema_version": 1/"schema_version": 7/' "$dir/torch.json" > "$dir/version.json"
expect_error "version.json: field 'schema_version' is 7, expected 1" ops --torch_report "$dir/version.json"
sed 's/"op": "mm.out", //' "$dir/torch.json" > "$dir/noname.json"
expect_error "noname.json: field 'ops[0].op' is missing" ops --torch_report "$dir/noname.json"
expect_error "absent.json: cannot open the report" ops --torch_report "$dir/absent.json"
# A training config's model as the fleet service probes it: coverage, step time, and for a
# transformer the shape the performance model needs (vocabulary from the data).
printf 'layers: 2\nwidth: 64\nheads: 2\ncontext: 32\nbatch: 4\nprecision: bf16\n' > "$dir/probe.yaml"
"$loom" ops --config "$dir/probe.yaml" --backend cpu --threads 1 --steps 2 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["transformer"] == {"layers": 2, "hidden": 64, "heads": 2, "ffn": 256, "vocab": 65,
                            "seq": 32, "batch": 4, "precision": "bf16"}, r["transformer"]
assert r["launches_per_step"] == sum(c["calls"] for c in r["ops"].values() if c["path"] != "decomposed")
assert r["step_s"] > 0
' || { echo "FAIL: loom ops --config --json"; failures=$((failures + 1)); }
# The probe measures the step loom train runs for the config: graph mode replays the
# fused chains (OpenCL: the CPU's GPT step has none to fuse; none with fusion: false),
# dropout runs its op, an eager step has neither.
printf 'layers: 1\nwidth: 32\nheads: 2\ncontext: 16\nbatch: 2\nsteps: 5\n' > "$dir/probe-eager.yaml"
{ cat "$dir/probe-eager.yaml"; printf 'mode: graph\n'; } > "$dir/probe-graph.yaml"
{ cat "$dir/probe-graph.yaml"; printf 'fusion: false\n'; } > "$dir/probe-unfused.yaml"
{ cat "$dir/probe-eager.yaml"; printf 'dropout: 0.1\n'; } > "$dir/probe-dropout.yaml"
graph_backend=cpu
"$loom" ops --backend all 2>/dev/null | grep -q '^opencl:' && graph_backend=opencl
for run in eager graph unfused dropout; do
  backend=cpu
  [[ $run == graph || $run == unfused ]] && backend=$graph_backend
  "$loom" ops --config "$dir/probe-$run.yaml" --backend $backend --threads 1 --steps 2 --json > "$dir/probe-$run.json"
done
python3 - "$dir" "$graph_backend" <<'EOF_PY' || { echo "FAIL: loom ops --config measures another step than loom train runs"; failures=$((failures + 1)); }
import json, sys
ops = {run: json.load(open(f"{sys.argv[1]}/probe-{run}.json"))["ops"] for run in ("eager", "graph", "unfused", "dropout")}
assert "fused_elementwise" not in ops["eager"] and "dropout" not in ops["eager"], sorted(ops["eager"])
assert "fused_elementwise" not in ops["unfused"], sorted(ops["unfused"])
if sys.argv[2] == "opencl":
    assert ops["graph"]["fused_elementwise"]["path"] == "native" and ops["graph"]["fused_elementwise"]["calls"] > 0, ops["graph"]
else:
    print("note: no OpenCL backend here: the fused graph step is not checked")
assert ops["dropout"]["dropout"]["calls"] > 0 and ops["dropout"]["dropout_backward"]["calls"] > 0, sorted(ops["dropout"])
print("ok: loom ops --config measures the step loom train runs (graph, fusion, dropout)")
EOF_PY
expect_error "loom ops --config: --fusion measures the flags' model" ops --config "$dir/probe-eager.yaml" --fusion
expect_error "node count '0' is not a positive integer" fleet simulate --fleet v100:0x4 --synthetic 10
expect_error "needs exactly one of --gavel, --jobs, --synthetic and --alibaba" fleet simulate --fleet v100:2x4
expect_error "missing.trace: cannot open the trace" fleet simulate --fleet v100:2x4 --gavel "$dir/missing.trace" \
  --throughputs data/traces/gavel/simulation_throughputs.json
"$loom" fleet simulate --fleet v100:2x4,k80:2x4 --gavel data/traces/gavel/msr_seed0/b436b2.trace --policy fastest \
  | grep -q '^fastest ' || { echo "FAIL: loom fleet simulate on a Gavel trace"; failures=$((failures + 1)); }
# What the numbers rest on: measured and extrapolated run times, the refusal to
# extrapolate, and the sensitivity report.
"$loom" fleet simulate --fleet v100:2x4,k80:2x4 --gavel data/traces/gavel/msr_seed0/11cb48.trace --policy fifo \
  | grep -q '^run times: 1819 from measured throughputs, 181 extrapolated' \
  || { echo "FAIL: fleet simulate names its measured and extrapolated run times"; failures=$((failures + 1)); }
expect_error "'A3C' on 4 workers: data/traces/gavel/simulation_throughputs.json measures it on 1 only" \
  fleet simulate --fleet v100:2x4 --gavel data/traces/gavel/msr_seed0/11cb48.trace --strict-throughputs
"$loom" fleet rounds --fleet v100:4,k80:4 --gavel data/traces/gavel/msr_seed0/2869ce.trace --policy fifo_perf \
  --sensitivity --json | tail -1 | grep -q '"throughputs_plus_20_mean_jct_h":[0-9]' \
  || { echo "FAIL: fleet rounds --sensitivity"; failures=$((failures + 1)); }
# (A small trace: the interior-point solver takes minutes on the large one under the sanitizers.)
"$loom" fleet rounds --fleet v100:4,k80:4 --gavel data/traces/gavel/msr_seed0/51b7ef.trace --policy max_min_fairness_perf \
  --solver interior_point --json | tail -1 | grep -q '"mean_jct_h":[0-9]' \
  || { echo "FAIL: fleet rounds --solver interior_point"; failures=$((failures + 1)); }
"$loom" fleet simulate --fleet v100:2x4,k80:2x4 --gavel data/traces/gavel/msr_seed0/b436b2.trace --policy backfill \
  --seeds 1 2 3 --json | tail -1 | grep -q '"ci95_h":[0-9]' \
  || { echo "FAIL: fleet simulate --seeds"; failures=$((failures + 1)); }
"$loom" fleet simulate --alibaba data/traces/alibaba-pai-gpu-v2023/openb_pod_list_gpuspec33.csv --policy backfill --json \
  | grep -q '"finished":6203' || { echo "FAIL: fleet simulate --alibaba"; failures=$((failures + 1)); }
expect_error "the node list is the fleet; drop --fleet" fleet simulate --fleet v100:2x4 \
  --alibaba data/traces/alibaba-pai-gpu-v2023/openb_pod_list_gpuspec33.csv
# loom bench writes a device profile in the documented format.
"$loom" bench --device cpu --quick --out "$dir/profile.json" > /dev/null 2>&1 || { echo "FAIL: loom bench"; failures=$((failures + 1)); }
python3 - "$dir/profile.json" <<'PY' || { echo "FAIL: profile format"; failures=$((failures + 1)); }
import json, sys
p = json.load(open(sys.argv[1]))
assert p["format"] == "loom-device-profile/1", p["format"]
assert p["gemm"] and all(g["tflops"] > 0 for g in p["gemm"])
assert p["memory_bandwidth_gbs"] > 0 and p["launch_latency_us"] > 0
assert p["ops"]["by_op"]["matmul"]["calls"] > 0
PY
expect_error "device 'tpu' is not available" bench --device tpu
for d in o1 o2 o3 o4 o5; do
  if [[ -e "$dir/$d/checkpoint" ]]; then echo "FAIL: checkpoint left in $d"; failures=$((failures + 1)); fi
done
# A tiny successful run: train, sample, eval.
"$loom" train --data random --vocab 30 --layers 1 --width 16 --heads 2 --context 8 --batch 2 --steps 3 \
  --out "$dir/ok" --json > "$dir/ok.log" || { echo "FAIL: tiny run"; failures=$((failures + 1)); }
tail -n 1 "$dir/ok.log" | grep -q '"tokens_per_s"' || { echo "FAIL: last line is not the JSON summary"; failures=$((failures + 1)); }
# Sampling continues the prompt once (the prompt is printed, then only new text).
printf 'abcabcabcabcabcabcabcabcabcabcabcabc\n' > "$dir/abc.txt"
"$loom" train --data "$dir/abc.txt" --layers 1 --width 16 --heads 2 --context 8 --batch 2 --steps 2 \
  --out "$dir/abc" --json --eval_every 0 > /dev/null || { echo "FAIL: abc run"; failures=$((failures + 1)); }
bytes=$("$loom" sample "$dir/abc/checkpoint" --prompt "abc" --tokens 5 | wc -c)
[[ $bytes -eq 9 ]] || { echo "FAIL: sample printed $bytes bytes, expected prompt (3) + 5 + newline"; failures=$((failures + 1)); }
# ONNX: an exported PyTorch MLP runs to PyTorch's outputs, trains on MNIST, and bad use
# is named.
fx=tests/fixtures/onnx
"$loom" onnx "$fx/mlp_mnist.onnx" --input "$fx/mlp_mnist/input_0.pb" --expect "$fx/mlp_mnist/output_0.pb" \
  > "$dir/onnx.log" 2>&1 && grep -q "within tolerance" "$dir/onnx.log" \
  || { echo "FAIL: loom onnx mlp_mnist: $(tail -n 2 "$dir/onnx.log")"; failures=$((failures + 1)); }
"$loom" onnx "$fx/tiny_gpt_block.onnx" --input "$fx/tiny_gpt_block/input_0.pb" --expect "$fx/tiny_gpt_block/output_0.pb" \
  --json | grep -q '"op":"Erf","count":1,"supported":true.*"within_tolerance":true' \
  || { echo "FAIL: loom onnx tiny_gpt_block"; failures=$((failures + 1)); }
# The element types a model uses, and how Loom holds each (float16 widened to f32).
"$loom" onnx "$fx/node/test_cast_FLOAT_to_FLOAT16/model.onnx" | grep -q "^element types: FLOAT (f32), FLOAT16 (f32, widened" \
  || { echo "FAIL: loom onnx does not report the model's element types"; failures=$((failures + 1)); }
# A NaN where a number is expected is outside every tolerance (log of negative values).
"$loom" onnx "$fx/node/test_log/model.onnx" --input "$fx/node/test_neg/test_data_set_0/input_0.pb" \
  --expect "$fx/node/test_neg/test_data_set_0/input_0.pb" > "$dir/onnx_nan.log" 2>&1
[[ $? -eq 1 ]] && grep -q "max |error| inf .*OUTSIDE TOLERANCE" "$dir/onnx_nan.log" \
  || { echo "FAIL: loom onnx --expect passed a NaN output: $(tail -n 1 "$dir/onnx_nan.log")"; failures=$((failures + 1)); }
expect_error "expected shape [2,1,28,28]" onnx "$fx/mlp_mnist.onnx" --input "$fx/mlp_mnist/input_0.pb" --expect "$fx/mlp_mnist/input_0.pb"
expect_error "absent.onnx: cannot open" onnx "$dir/absent.onnx"
expect_error "give a MODEL.onnx or --conformance DIR" onnx
expect_error "$dir/none: not a folder" onnx --conformance "$dir/none"
expect_error "no test folders with a model.onnx" onnx --conformance "$dir"
# The command's report on a few fixtures (test_io runs all of them on every backend), and a
# test whose op Loom does not import.
mkdir -p "$dir/node"
for t in test_abs test_attention_4d test_resize_upsample_scales_linear test_where_example; do cp -r "$fx/node/$t" "$dir/node/"; done
cp -r "$fx/node/test_abs" "$dir/node/test_unknown_op" && sed -i 's/Abs/Zzz/' "$dir/node/test_unknown_op/model.onnx"
"$loom" onnx --conformance "$dir/node" > "$dir/conformance.log" 2>&1
grep -qE '^5 tests on cpu: 4 pass, 0 fail, 0 error, 1 use an op Loom does not import' "$dir/conformance.log" \
  || { echo "FAIL: loom onnx --conformance on the fixtures: $(tail -n 2 "$dir/conformance.log")"; failures=$((failures + 1)); }
"$loom" onnx "$fx/mlp_mnist.onnx" --nodes | grep -qE '^  Gemm \(.*transB=1' \
  || { echo "FAIL: loom onnx --nodes"; failures=$((failures + 1)); }
expect_error "model = onnx needs --onnx FILE" train --model onnx --out "$dir/o12"
"$loom" ops --model onnx --onnx "$fx/tiny_gpt_block.onnx" --backend partial > "$dir/onnx_ops.log" 2>&1 \
  && grep -qE '^erf +forward +fallback 1' "$dir/onnx_ops.log" \
  || { echo "FAIL: loom ops for an imported model: $(tail -n 3 "$dir/onnx_ops.log")"; failures=$((failures + 1)); }
expect_error "loom ops --model onnx needs --onnx FILE" ops --model onnx
# --fusion: the chains graph fusion made, and the step unfused and fused, in schema 1.
"$loom" ops --model onnx --onnx "$fx/tiny_gpt_block.onnx" --backend cpu --threads 1 --fusion --json \
  | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
f = r["fusion"]
assert r["schema_version"] == 1, r["schema_version"]
assert f["capturable"] and f["kernel"], f
assert len(f["chains"]) >= 10 and f["nodes_fused"] < f["nodes_unfused"], f
assert all(c["members"] >= 2 and "(" in c["program"] for c in f["chains"]), f["chains"]
assert f["step_s_fused"] > 0 and f["step_s_unfused"] > 0
# the CPU runs matmul_elementwise as its decomposition: no product is folded with its chain
assert f["gemm_epilogues"] == 0 and not any(c["gemm_epilogue"] for c in f["chains"]), f
' || { echo "FAIL: loom ops --fusion --json"; failures=$((failures + 1)); }
# Where OpenCL is present: chains folded into the GEMMs that produce their input.
if "$loom" ops --model mlp --backend opencl > /dev/null 2>&1; then
  "$loom" ops --model onnx --onnx "$fx/tiny_gpt_block.onnx" --backend opencl --fusion --json \
    | python3 -c '
import json, sys
f = json.loads(sys.stdin.readline())["fusion"]
assert f["gemm_epilogues"] >= 2 and any(c["gemm_epilogue"] for c in f["chains"]), f
' || { echo "FAIL: loom ops --fusion --json on opencl: GEMM epilogues"; failures=$((failures + 1)); }
fi
# loom train --mode graph fuses by default (--fusion false: not), with the same losses.
for fusion in true false; do
  "$loom" train --model onnx --onnx "$fx/tiny_gpt_block.onnx" --data data/tinyshakespeare/input.txt \
    --context 32 --batch 2 --steps 6 --mode graph --fusion "$fusion" --eval_every 0 --final_eval false \
    --save false --progress false --json --out "$dir/fusion_$fusion" 2>/dev/null | tail -n 1 > "$dir/fusion_$fusion.json"
done
python3 - "$dir/fusion_true.json" "$dir/fusion_false.json" <<'PY' || { echo "FAIL: loom train --fusion"; failures=$((failures + 1)); }
import json, sys
fused, unfused = (json.load(open(p)) for p in sys.argv[1:])
assert fused["graph_fused_chains"] >= 10 and unfused["graph_fused_chains"] == 0, (fused, unfused)
assert fused["graph_nodes"] < unfused["graph_nodes"], (fused, unfused)
assert fused["loss_last"] == unfused["loss_last"], (fused["loss_last"], unfused["loss_last"])
PY
"$loom" ops --model onnx --onnx "$fx/tiny_gpt_block.onnx" --backend partial --fusion \
  | grep -q '^fusion on partial: none (the backend has no fused_elementwise kernel' \
  || { echo "FAIL: loom ops --fusion on a backend without the fused kernel"; failures=$((failures + 1)); }
"$loom" train --model onnx --onnx "$fx/mlp_mnist.onnx" --steps 20 --out "$dir/onnx_train" --json > "$dir/onnx_train.log" 2>&1 \
  && tail -n 1 "$dir/onnx_train.log" | grep -q '"test_accuracy"' \
  || { echo "FAIL: training the imported ONNX model: $(tail -n 2 "$dir/onnx_train.log")"; failures=$((failures + 1)); }
head -c 20000 data/tinyshakespeare/input.txt > "$dir/shakespeare.txt"
"$loom" train --model onnx --onnx "$fx/tiny_gpt_block.onnx" --data "$dir/shakespeare.txt" --context 32 --batch 2 --steps 5 \
  --eval_every 0 --out "$dir/onnx_text" --json > "$dir/onnx_text.log" 2>&1 \
  && tail -n 1 "$dir/onnx_text.log" | grep -q '"val_loss"' \
  || { echo "FAIL: training the imported transformer on text: $(tail -n 2 "$dir/onnx_text.log")"; failures=$((failures + 1)); }
expect_error "the model takes token ids, not MNIST images" train --model onnx --onnx "$fx/tiny_gpt_block.onnx" --steps 1 --out "$dir/o13"
# Checkpoints of every model kind load in sample (text models) and eval, from any folder:
# the imported classifier's eval accuracy is its training run's test accuracy.
trained=$(tail -n 1 "$dir/onnx_train.log" | python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["test_accuracy"])')
evaluated=$(cd / && "$loom" eval "$dir/onnx_train/checkpoint" --data "$OLDPWD/data/mnist" --json | python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["test_accuracy"])')
[[ "$trained" == "$evaluated" ]] || { echo "FAIL: eval of the ONNX classifier: $evaluated, training said $trained"; failures=$((failures + 1)); }
text=$(cd / && "$loom" sample "$dir/onnx_text/checkpoint" --prompt "ROMEO:" --tokens 20 --seed 3)
[[ ${#text} -ge 26 ]] || { echo "FAIL: sample of the imported transformer printed '$text'"; failures=$((failures + 1)); }
(cd / && "$loom" eval "$dir/onnx_text/checkpoint" --data "$dir/shakespeare.txt" --json) | grep -q '"loss"' \
  || { echo "FAIL: eval of the imported transformer"; failures=$((failures + 1)); }
"$loom" train --model mlp --steps 5 --out "$dir/mlp" --json > /dev/null 2>&1
"$loom" eval "$dir/mlp/checkpoint" --data mnist | grep -q "test accuracy" \
  || { echo "FAIL: eval of an MLP checkpoint"; failures=$((failures + 1)); }
expect_error "does not generate text" sample "$dir/mlp/checkpoint"
# Bad checkpoint metadata is named (file, key, text, range), never an internal error: the
# step, a model description out of range, and the optimizer state's step count (read on
# --resume, from a copy of the run whose state says 99999999999999999999 steps).
retag() {  # retag FILE OUT KEY VALUE [JSON_FIELD]: one metadata entry (or loom_model field) changed
  python3 - "$@" <<'PY'
import json, struct, sys
path, out, key, value = sys.argv[1:5]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
if len(sys.argv) > 5:
    model = json.loads(header["__metadata__"][key])
    model[sys.argv[5]] = json.loads(value)
    header["__metadata__"][key] = json.dumps(model)
else:
    header["__metadata__"][key] = value
text = json.dumps(header).encode()
open(out, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
}
retag "$dir/abc/checkpoint/model.safetensors" "$dir/bad_step.safetensors" step 12abc
expect_error "metadata 'step' = '12abc', expected an integer" sample "$dir/bad_step.safetensors"
retag "$dir/abc/checkpoint/model.safetensors" "$dir/bad_layers.safetensors" loom_model 100000 layers
expect_error "loom_model field 'layers' is 100000, expected an integer in [1, 1024]" sample "$dir/bad_layers.safetensors"
cp -r "$dir/abc" "$dir/abc_resume"
retag "$dir/abc/checkpoint/train_state.safetensors" "$dir/abc_resume/checkpoint/train_state.safetensors" \
  optimizer_steps 99999999999999999999
expect_error "metadata 'optimizer_steps' = '99999999999999999999', expected an integer in [0," \
  train --data "$dir/abc.txt" --layers 1 --width 16 --heads 2 --context 8 --batch 2 --steps 4 \
  --out "$dir/abc_resume" --resume --eval_every 0
# LOOM_CPU_GEMM takes auto, relayout or as_called; anything else is named.
gemm_env=$(LOOM_CPU_GEMM=relaid "$loom" train --data random --vocab 30 --layers 1 --width 16 --heads 2 \
  --context 8 --batch 2 --steps 1 --out "$dir/gemm_env" 2>&1 >/dev/null)
[[ "$gemm_env" == *"LOOM_CPU_GEMM = 'relaid', expected auto (the default), relayout or as_called"* ]] \
  || { echo "FAIL: LOOM_CPU_GEMM=relaid: $gemm_env"; failures=$((failures + 1)); }
LOOM_CPU_GEMM=relayout "$loom" train --data random --vocab 30 --layers 1 --width 16 --heads 2 --context 8 \
  --batch 2 --steps 1 --out "$dir/gemm_relayout" > /dev/null 2>&1 || { echo "FAIL: LOOM_CPU_GEMM=relayout"; failures=$((failures + 1)); }
echo "$failures failed"
[[ $failures -eq 0 ]]
