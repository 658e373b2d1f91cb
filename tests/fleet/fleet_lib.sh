# Helpers for the fleet service tests: start and stop a daemon on a free port, submit jobs,
# wait for states. Source it; set $loom first.
fleet_start() {  # STATE POOLS [extra serve flags...]: starts a daemon, sets LOOM_FLEET_SERVER
  local state=$1 pools=$2; shift 2
  rm -f "$state/address"
  "$loom" fleet serve --state "$state" --pools "$pools" --port 0 "$@" >> "$state.serve.log" 2>&1 &
  fleet_pid=$!
  # Until the daemon has written its address (atomically), or has died; 120 s at most.
  local deadline=$((SECONDS + 120))
  until [[ -s "$state/address" ]]; do
    kill -0 "$fleet_pid" 2>/dev/null || { echo "daemon died: $(tail -n 3 "$state.serve.log")"; return 1; }
    (( SECONDS < deadline )) || { echo "daemon wrote no address in 120 s: $(tail -n 3 "$state.serve.log")"; return 1; }
    sleep 0.05
  done
  export LOOM_FLEET_SERVER=$(cat "$state/address")
}
fleet_kill() {  # kill -9 the daemon
  kill -KILL "$fleet_pid" 2>/dev/null
  wait "$fleet_pid" 2>/dev/null
}
fleet_stop() {
  kill -TERM "$fleet_pid" 2>/dev/null
  wait "$fleet_pid" 2>/dev/null
}
job_state() { "$loom" fleet status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
wait_state() {  # ID STATE[|STATE...] TIMEOUT_S: until the job is in one of the states
  local s="" deadline=$((SECONDS + $3))
  while (( SECONDS < deadline )); do
    s=$(job_state "$1" 2>/dev/null)
    [[ "|$2|" == *"|$s|"* ]] && return 0
    sleep 0.1
  done
  echo "job $1: state '$s' after $3 s, expected $2"
  return 1
}
# The job has logged STEPS training steps (1 by default): `loom train` is past its setup,
# with its SIGTERM handler installed, so a preemption or a cancel now is a clean stop.
wait_training() {  # ID STATE_DIR TIMEOUT_S [STEPS]
  local metrics="$2/jobs/$1/out/metrics.jsonl" deadline=$((SECONDS + $3)) steps=${4:-1}
  until [[ -s "$metrics" ]] && (( $(grep -c '"loss"' "$metrics") >= steps )); do
    (( SECONDS < deadline )) || { echo "job $1: fewer than $steps training steps logged in $3 s"; return 1; }
    sleep 0.05
  done
}
# The job's own records say its current attempt has ended (an "end" record after its start).
attempt_ended() {  # ID STATE_DIR
  tail -n 1 "$2/jobs/$1/records.jsonl" 2>/dev/null | grep -q '"event":"end"'
}
wait_all_done() {  # TIMEOUT_S: every job ended (succeeded, failed, cancelled, unplaceable)
  for _ in $(seq 1 $(( $1 * 4 ))); do
    "$loom" fleet status --json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
sys.exit(0 if all(j["state"] in ("succeeded", "failed", "cancelled", "unplaceable") for j in jobs) else 1)' && return 0
    sleep 0.25
  done
  "$loom" fleet status
  return 1
}
submit_id() { "$loom" fleet submit "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
