#!/usr/bin/env bash
# Two local Slurm clusters at once, as two sites of the fleet: site-a (h100:2,910b:2 on ports
# 6817/6818) and site-b (a100:2 on 6917/6918). Checks typed GRES, job states, the jobcomp
# file, lookup by job name, which processes scancel --signal=TERM reaches, and rejection of
# a chip type the site lacks; then takes both down. Prints PASS/FAIL lines and timings.
# Exit 0 iff every check passed; 77 (skip) when Slurm cannot run here (says why).
# Usage: bash tests/fleet/slurm/smoke.sh      (as root; SLURM_TEST_KEEP=1 keeps the dirs)
# shellcheck disable=SC2016  # '$CUDA_VISIBLE_DEVICES' in --wrap is for the job to expand
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
if ! slurm_available; then
  echo "SKIP: slurm smoke test: Slurm cannot run here (see above)"
  exit 77
fi

passed=0 failed=0
check() {  # DESCRIPTION COMMAND...
  local d=$1; shift
  if "$@"; then echo "PASS $d"; passed=$((passed + 1)); else echo "FAIL $d"; failed=$((failed + 1)); fi
}
match() { [[ $1 =~ $2 ]]; }    # STRING REGEX
wait_state() {  # SITE JOBID STATE TIMEOUT_S: until squeue -t all says STATE
  local s=""
  for _ in $(seq 1 $(( $4 * 10 ))); do
    s=$(slurm_on "$1" squeue -h -t all -j "$2" -o %T 2>/dev/null)
    [ "$s" = "$3" ] && return 0
    sleep 0.1
  done
  echo "  job $2 on $1: state '$s' after $4 s, expected $3"
  return 1
}
wait_file() {  # FILE TIMEOUT_S
  for _ in $(seq 1 $(( $2 * 20 ))); do [ -e "$1" ] && return 0; sleep 0.05; done
  return 1
}

up=()
down_all() { local n; for n in "${up[@]}"; do slurm_cluster_down "$n"; done; up=(); }
trap 'down_all' EXIT
trap 'exit 130' INT TERM

t0=$(date +%s%N)
slurm_cluster_up site-a 6817 6818 h100:2,910b:2 || { echo "FAIL site-a up"; exit 1; }
up=(site-a); up_a=$SLURM_UP_MS
slurm_cluster_up site-b 6917 6918 a100:2 || { echo "FAIL site-b up"; exit 1; }
up=(site-b site-a); up_b=$SLURM_UP_MS
up_total=$(_slurm_ms_since "$t0")
A=$SLURM_DIR_SITE_A B=$SLURM_DIR_SITE_B

# --- both sites
for s in site-a site-b; do
  check "$s: node idle" test "$(slurm_on $s sinfo -h -N -n localhost -o %T)" = idle
done
check "site-a: Gres=gpu:h100:2,gpu:910b:2" \
  match "$(slurm_on site-a scontrol show node localhost)" 'Gres=gpu:h100:2,gpu:910b:2($|[[:space:]])'
check "site-b: Gres=gpu:a100:2" match "$(slurm_on site-b scontrol show node localhost)" 'Gres=gpu:a100:2($|[[:space:]])'
check "two clusters: ClusterName site-a and site-b" \
  match "$(slurm_on site-a scontrol show config)$(slurm_on site-b scontrol show config)" \
  'ClusterName += site-a.*ClusterName += site-b'

# --- site-a: a typed job, its state, the jobcomp file, lookup by name
j1=$(slurm_on site-a sbatch --parsable --gres=gpu:910b:1 --job-name loom-test-1 -D "$A/out" \
       --wrap 'echo CVD=$CUDA_VISIBLE_DEVICES')
check "site-a: sbatch --parsable prints just the job id ('$j1')" match "$j1" '^[0-9]+$'
check "site-a: 910b job completed" wait_state site-a "$j1" COMPLETED 20
echo "  job $j1 output: $(cat "$A/out/slurm-$j1.out" 2>/dev/null)"
check "site-a: it got a 910b index (2 or 3)" grep -qxE 'CVD=[23]' "$A/out/slurm-$j1.out"
check "site-a: squeue -t all -j $j1 -o %T says COMPLETED" \
  test "$(slurm_on site-a squeue -h -t all -j "$j1" -o %T)" = COMPLETED
check "site-a: jobcomp file has job $j1 COMPLETED" \
  grep -qE "^JobId=$j1 .*Name=loom-test-1 JobState=COMPLETED" "$A/log/jobcomp.txt"
check "site-a: squeue --name loom-test-1 -t all finds $j1" \
  test "$(slurm_on site-a squeue --name loom-test-1 -h -t all -o %i)" = "$j1"
check "site-a: squeue --name without -t all shows no finished job" \
  test -z "$(slurm_on site-a squeue --name loom-test-1 -h -o %i)"
check "site-b: does not see site-a's job" \
  test -z "$(slurm_on site-b squeue --name loom-test-1 -h -t all -o %i)"

# --- site-a: scancel --signal=TERM with --full, --batch and neither. The batch script traps
# TERM (writes shell-term) and runs a child that traps TERM itself (writes child-term).
cat >"$A/out/term.sh" <<'EOF'
#!/bin/bash
d=$1
trap 'touch "$d/shell-term"' TERM
bash -c 'trap "touch \"$0/child-term\"; exit 0" TERM; while :; do sleep 0.2; done' "$d" &
touch "$d/ready"
wait            # a trapped TERM ends the wait at once
sleep 1         # time for a signalled child to write its file
exit 0
EOF
declare -A tj
for how in full batch none; do
  mkdir -p "$A/out/term-$how"
  tj[$how]=$(slurm_on site-a sbatch --parsable --job-name "loom-term-$how" -D "$A/out/term-$how" \
               "$A/out/term.sh" "$A/out/term-$how")
done
for how in full batch none; do
  check "site-a: job loom-term-$how running, trap set" wait_file "$A/out/term-$how/ready" 20
done
check "site-a: squeue --name loom-term-full finds running job ${tj[full]}" \
  test "$(slurm_on site-a squeue --name loom-term-full -h -o %i)" = "${tj[full]}"
slurm_on site-a scancel --signal=TERM --full "${tj[full]}"
slurm_on site-a scancel --signal=TERM --batch "${tj[batch]}"
slurm_on site-a scancel --signal=TERM "${tj[none]}"
check "--full: the batch script's trap ran" wait_file "$A/out/term-full/shell-term" 5
check "--full: the child's own trap ran too" wait_file "$A/out/term-full/child-term" 5
check "--full: job ended COMPLETED (trap, exit 0)" wait_state site-a "${tj[full]}" COMPLETED 10
check "--batch: the batch script's trap ran" wait_file "$A/out/term-batch/shell-term" 5
check "--batch: job ended COMPLETED" wait_state site-a "${tj[batch]}" COMPLETED 10
check "--batch: the child got no TERM" test ! -e "$A/out/term-batch/child-term"
sleep 1   # --full/--batch took over a second already; give "neither" as long again
check "neither: nothing got TERM, job still RUNNING" \
  test ! -e "$A/out/term-none/shell-term" -a ! -e "$A/out/term-none/child-term" \
       -a "$(slurm_on site-a squeue -h -j "${tj[none]}" -o %T)" = RUNNING
slurm_on site-a scancel "${tj[none]}"
check "plain scancel: the batch script's trap ran" wait_file "$A/out/term-none/shell-term" 5
check "plain scancel: job CANCELLED" wait_state site-a "${tj[none]}" CANCELLED 10

# --- site-b: its own chip type only
j2=$(slurm_on site-b sbatch --parsable --gres=gpu:a100:1 -D "$B/out" --wrap 'echo CVD=$CUDA_VISIBLE_DEVICES')
check "site-b: a100 job completed" wait_state site-b "$j2" COMPLETED 20
check "site-b: it got an a100 index (0 or 1)" grep -qxE 'CVD=[01]' "$B/out/slurm-$j2.out"
r=$(slurm_on site-b sbatch --parsable --gres=gpu:h100:1 -D "$B/out" --wrap true 2>&1); rc=$?
echo "  site-b --gres=gpu:h100:1 -> rc $rc: $r"
check "site-b: h100 rejected at submit" test "$rc" != 0 -a -n "$r"
d1=$(slurm_on site-b sbatch --parsable --hold --job-name loom-dup -D "$B/out" --wrap true)
d2=$(slurm_on site-b sbatch --parsable --hold --job-name loom-dup -D "$B/out" --wrap true)
check "site-b: a second job with the same name is accepted; squeue --name shows both" \
  test "$(slurm_on site-b squeue --name loom-dup -h -o %i | sort -n | tr '\n' ' ')" = "$d1 $d2 "
slurm_on site-b scancel "$d1" "$d2"

# --- down, both; nothing of theirs may be left
t1=$(date +%s%N)
slurm_cluster_down site-b; down_b=$SLURM_DOWN_MS
slurm_cluster_down site-a; down_a=$SLURM_DOWN_MS
up=()
down_total=$(_slurm_ms_since "$t1")
leftover=$(grep -lzE "^SLURM_CONF=($A|$B)/" /proc/[0-9]*/environ 2>/dev/null | grep -v "^/proc/$$/" || true)
check "down: no process of either site left" test -z "$leftover"
if [ "${SLURM_TEST_KEEP:-0}" != 1 ]; then
  check "down: both dirs removed" test ! -e "$A" -a ! -e "$B"
fi
ports_free() { local p; for p; do ! _slurm_port_busy "$p" || return 1; done; }
check "down: ports 6817 6818 6917 6918 free" ports_free 6817 6818 6917 6918

echo "timing: up site-a ${up_a} ms, site-b ${up_b} ms (both ${up_total} ms);" \
     "down site-b ${down_b} ms, site-a ${down_a} ms (both ${down_total} ms)"
echo "smoke: $passed passed, $failed failed"
[ "$failed" = 0 ]
