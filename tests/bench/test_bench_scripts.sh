#!/usr/bin/env bash
# The benchmarks run from a clone alone: every file that bench/run-all's commands name is
# in the repository (their outputs under build/ aside), no benchmark, tool or script
# reaches outside the repository (../shared, another checkout's absolute path), and the
# Python drivers parse their flags. Usage: test_bench_scripts.sh (from anywhere)
set -u
cd "$(dirname "$0")/../.."
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

list=$(bench/run-all --list) || fail "bench/run-all --list exited non-zero"
# The outputs ($out = build/bench/...) are written by the run, not read.
named=$(sed -e 's#build/[^ ]*##g' <<< "$list" |
  grep -o -E '(bench|tools|tests/fixtures|scripts|catalog|data)/[A-Za-z0-9_./-]+' | sort -u)
[[ $(wc -l <<< "$named") -ge 20 ]] || fail "run-all --list names only $(wc -l <<< "$named") files: $named"
for path in $named; do
  [[ -e "$path" ]] || fail "run-all names $path, which is not in the repository"
done

outside=$(grep -rn -E '\.\./shared|/work/shared|/work/main' bench tools scripts fuzz Makefile .ci 2>/dev/null)
[[ -z "$outside" ]] || fail "a file reaches outside the repository: $outside"

for driver in bench/compare_torch bench/compare_ddp; do
  "$driver" --help > /dev/null || fail "$driver --help"
done
for script in bench/torch_gpt_bench.py bench/torch_ddp_gpt.py; do
  python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$script" || fail "$script does not parse"
done

echo "$failures failed"
[[ $failures -eq 0 ]]
