# Throwaway local Slurm clusters for tests: one node each, typed fake GPUs, everything in one
# temp dir per cluster, nothing in /etc used or changed. Several clusters can run at once
# ("sites"), each with its own ClusterName, ports, munged and chip types.
# Source it (bash); see README.md next to it. Built against Debian 12 (slurm-wlm 22.05,
# munge 0.5.15), run as root:
#   apt-get install -y --no-install-recommends slurm-wlm munge
#
#   source tests/fleet/slurm/cluster.sh
#   slurm_available || exit 77                                    # says why
#   read -r ctld slurmd < <(slurm_free_ports 2)                   # or fixed ports
#   slurm_cluster_up site-a "$ctld" "$slurmd" h100:2,910b:2 || exit 1  # sets SLURM_CONF_SITE_A, SLURM_DIR_SITE_A
#   slurm_cluster_up site-b 6917 6918 a100:2        || exit 1     # sets SLURM_CONF_SITE_B, SLURM_DIR_SITE_B
#   trap 'slurm_cluster_down site-b; slurm_cluster_down site-a' EXIT
#   SLURM_CONF=$SLURM_CONF_SITE_A sbatch ...      # or: slurm_on site-a sbatch ...
#
# NAME: letters, digits, '-' and '_', starting with a letter. It is the ClusterName (lower
# case) and, upper-cased with '-' turned into '_', the suffix of the variables.
# GRES_SPEC: TYPE:COUNT[,TYPE:COUNT...]; the node gets Gres=gpu:TYPE:COUNT,... and
# Features=TYPE,...; GPU indices (CUDA_VISIBLE_DEVICES) run over the types in the order given,
# e.g. h100:2,910b:2 -> h100 = 0-1, 910b = 2-3.
#
# Knobs (environment): SLURM_TEST_KEEP=1 (down keeps the dir), SLURM_TEST_DEBUG (info),
# SLURM_TEST_CPUS (8), SLURM_TEST_UP_TIMEOUT (30 s), SLURM_TEST_TMP (${TMPDIR:-/tmp}).
# Sets after each up/down: SLURM_UP_MS / SLURM_DOWN_MS (how long it took).

slurm_available() {  # 0 if this host can run the clusters; else prints why, returns 1
  local c missing=() probe
  for c in slurmctld slurmd munged munge sbatch squeue scancel sinfo scontrol; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
  done
  if ((${#missing[@]})); then
    echo "slurm not available: missing ${missing[*]}" \
         "(apt-get install -y --no-install-recommends slurm-wlm munge)" >&2
    return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "slurm not available: the test clusters run as root (SlurmUser=root); uid is $(id -u)" >&2
    return 1
  fi
  # the fake GPUs are device nodes; a container without CAP_MKNOD cannot make them
  probe=$(mktemp -d "${SLURM_TEST_TMP:-${TMPDIR:-/tmp}}/slurmprobe.XXXXXX") || return 1
  if ! mknod "$probe/n" c 1 3 2>/dev/null; then
    rm -rf "$probe"
    echo "slurm not available: mknod fails here (no CAP_MKNOD?); fake GPUs need device nodes" >&2
    return 1
  fi
  rm -rf "$probe"
  return 0
}

_slurm_var() {  # NAME -> variable suffix (site-a -> SITE_A)
  local v=${1^^}
  printf '%s' "${v//-/_}"
}

_slurm_dir_of() {  # NAME -> the cluster's dir (empty if not up)
  local n
  n="SLURM_DIR_$(_slurm_var "$1")"
  printf '%s' "${!n:-}"
}

slurm_on() {  # NAME COMMAND...: run a Slurm client command against cluster NAME
  local d; d=$(_slurm_dir_of "${1:?usage: slurm_on NAME COMMAND...}")
  [ -n "$d" ] || { echo "slurm_on: cluster '$1' is not up" >&2; return 1; }
  shift
  SLURM_CONF="$d/etc/slurm.conf" "$@"
}

_slurm_alive() {  # PID: running and not a zombie (kill -0 counts zombies as alive, and
  local st      # orphans can stay zombies for seconds where init reaps late)
  [ -n "$1" ] || return 1
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $st != Z* ]]
}

slurm_free_ports() {  # N: prints N different TCP ports that no one listens on now (the
  # kernel's choice for a socket bound to port 0, all N held open until all are chosen), so
  # clusters of tests running side by side, or left behind by a killed run, never collide.
  python3 - "${1:?usage: slurm_free_ports N}" <<'PY'
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("", 0))
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}

_slurm_port_busy() {  # PORT: something listens on it (on 127.0.0.1)
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

_slurm_ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

slurm_cluster_up() {  # NAME CTLD_PORT SLURMD_PORT GRES_SPEC
  local name=${1:-} ctld_port=${2:-} slurmd_port=${3:-} spec=${4:-}
  local t0; t0=$(date +%s%N)
  SLURM_UP_MS=
  if [ $# -ne 4 ]; then
    echo "usage: slurm_cluster_up NAME CTLD_PORT SLURMD_PORT TYPE:COUNT[,TYPE:COUNT...]" >&2
    return 2
  fi
  if ! [[ $name =~ ^[A-Za-z][A-Za-z0-9_-]*$ ]]; then
    echo "slurm_cluster_up: bad NAME '$name' (letters, digits, - and _, starting with a letter)" >&2
    return 2
  fi
  if ! [[ $ctld_port =~ ^[0-9]+$ && $slurmd_port =~ ^[0-9]+$ ]] || [ "$ctld_port" = "$slurmd_port" ]; then
    echo "slurm_cluster_up $name: ports must be two different numbers ('$ctld_port' '$slurmd_port')" >&2
    return 2
  fi
  local var; var=$(_slurm_var "$name")
  if [ -n "$(_slurm_dir_of "$name")" ]; then
    echo "slurm_cluster_up: cluster '$name' is already up in $(_slurm_dir_of "$name")" >&2
    return 1
  fi
  # Two clusters on one port: slurmctld dies "Address already in use", slurmd cannot bind.
  local p
  for p in "$ctld_port" "$slurmd_port"; do
    if _slurm_port_busy "$p"; then
      echo "slurm_cluster_up $name: port $p is already in use" >&2
      return 1
    fi
  done

  # GRES_SPEC -> Gres=, Features=, gres.conf lines (global index over the types, in order).
  local item type count idx=0 gres="" feats="" gres_lines="" total
  local -a types=() counts=() items=()
  IFS=, read -ra items <<<"$spec"
  for item in "${items[@]}"; do
    type=${item%%:*} count=${item#*:}
    if ! [[ $item == *:* && $type =~ ^[A-Za-z0-9_]+$ && $count =~ ^[1-9][0-9]*$ ]]; then
      echo "slurm_cluster_up $name: bad GRES_SPEC '$spec' (want TYPE:COUNT[,TYPE:COUNT...])" >&2
      return 2
    fi
    types+=("$type") counts+=("$count")
  done
  ((${#types[@]})) || { echo "slurm_cluster_up $name: empty GRES_SPEC" >&2; return 2; }

  local T
  T=$(mktemp -d "${SLURM_TEST_TMP:-${TMPDIR:-/tmp}}/slurm-$name.XXXXXX") || return 1
  # munged wants every dir above its socket traversable by all ("Socket is inaccessible:
  # execute permissions for all required"); mktemp -d gives 0700.
  chmod 0755 "$T" || return 1
  mkdir -p "$T"/{munge,etc,state,log,run,dev,out} "$T/spool/slurmd.localhost" || return 1
  chmod 0711 "$T/munge"
  # Recorded before anything starts, so down can clean up a half-started cluster.
  printf -v "SLURM_DIR_$var" '%s' "$T"
  printf -v "SLURM_CONF_$var" '%s' "$T/etc/slurm.conf"
  export "SLURM_DIR_$var" "SLURM_CONF_$var"
  echo "$name" >"$T/name"

  local i
  for i in "${!types[@]}"; do
    type=${types[$i]} count=${counts[$i]}
    gres+="${gres:+,}gpu:$type:$count"
    feats+="${feats:+,}$type"
    # Fake GPUs must be char/block device nodes: 22.05 drops File-less GPUs, slurmd dies on a
    # missing File, and a regular file yields an empty CUDA_VISIBLE_DEVICES. 1:3 = /dev/null's
    # numbers; slurmd only stat()s them (no cgroup device constraint).
    local k
    for ((k = idx; k < idx + count; k++)); do
      mknod "$T/dev/fakegpu$k" c 1 3 || { _slurm_up_failed "$name" "$T" "mknod failed"; return 1; }
    done
    if [ "$count" = 1 ]; then
      gres_lines+="NodeName=localhost Name=gpu Type=$type File=$T/dev/fakegpu$idx"$'\n'
    else
      gres_lines+="NodeName=localhost Name=gpu Type=$type File=$T/dev/fakegpu[$idx-$((idx + count - 1))]"$'\n'
    fi
    idx=$((idx + count))
  done
  total=$idx

  if ! { dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none &&
          chmod 0400 "$T/munge/munge.key"; }; then
    _slurm_up_failed "$name" "$T" "cannot write the munge key"; return 1
  fi

  local conf=$T/etc/slurm.conf
  cat >"$conf" <<EOF
# Written by tests/fleet/slurm/cluster.sh for cluster $name ($spec, $total fake GPUs)
ClusterName=${name,,}
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/munge.sock
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$T/log/jobcomp.txt
MinJobAge=600
ReturnToService=2
SchedulerParameters=bf_interval=1
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/slurmd.%n
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.%n.log
SlurmctldDebug=${SLURM_TEST_DEBUG:-info}
SlurmdDebug=${SLURM_TEST_DEBUG:-info}
NodeName=localhost CPUs=${SLURM_TEST_CPUS:-8} RealMemory=4000 Gres=$gres Features=$feats State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  # gres.conf is found next to slurm.conf
  printf 'AutoDetect=off\n%s' "$gres_lines" >"$T/etc/gres.conf"

  # All daemons in the foreground (-F / -D) so that $! is the daemon's own PID.
  # munged -F logs to stderr, not to --log-file; as root it needs no --force.
  munged -F --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
         --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" \
         --seed-file="$T/munge/munged.seed" >"$T/log/munged.stdout" 2>&1 &
  echo $! >"$T/run/munged.bgpid"
  local ok=0
  for i in $(seq 1 100); do
    _slurm_alive "$(cat "$T/run/munged.bgpid")" || break
    munge -n -S "$T/munge/munge.sock" >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.05
  done
  [ "$ok" = 1 ] || { _slurm_up_failed "$name" "$T" "munged did not come up"; return 1; }

  # -c: empty state. SLURM_CONF is in the daemons' environment (and so in slurmstepd's);
  # the leak guard in slurm_cluster_down finds this cluster's processes by it.
  SLURM_CONF=$conf slurmctld -D -c -f "$conf" >"$T/log/slurmctld.stdout" 2>&1 &
  echo $! >"$T/run/slurmctld.bgpid"
  # Start slurmd only once slurmctld answers: a slurmd whose first registration fails
  # retries with a growing sleep (and ignores SIGTERM meanwhile).
  local deadline=$(( $(date +%s) + ${SLURM_TEST_UP_TIMEOUT:-30} )) st=""
  while :; do
    _slurm_alive "$(cat "$T/run/slurmctld.bgpid")" || { st="slurmctld died"; break; }
    SLURM_CONF=$conf timeout 5 scontrol ping 2>/dev/null | grep -q ' is UP' && { st=ctld-up; break; }
    [ "$(date +%s)" -lt "$deadline" ] || { st="slurmctld not answering"; break; }
    sleep 0.05
  done
  if [ "$st" != ctld-up ]; then _slurm_up_failed "$name" "$T" "$st"; return 1; fi

  # -N localhost: the host's own name is something else; tell slurmd which NodeName it is.
  SLURM_CONF=$conf slurmd -D -N localhost -f "$conf" >"$T/log/slurmd.stdout" 2>&1 &
  echo $! >"$T/run/slurmd.bgpid"

  # Ready = node idle. Check the daemons each round: sinfo and slurmd retry for a long time,
  # so a loop that only polls sinfo hangs when a daemon died on a fatal config error.
  st=""
  while :; do
    _slurm_alive "$(cat "$T/run/slurmctld.bgpid")" || { st="slurmctld died"; break; }
    _slurm_alive "$(cat "$T/run/slurmd.bgpid")" || { st="slurmd died"; break; }
    st=$(SLURM_CONF=$conf timeout 5 sinfo -h -N -n localhost -o '%T' 2>/dev/null)
    [ "$st" = idle ] && break
    [ "$(date +%s)" -lt "$deadline" ] || { st="not idle after ${SLURM_TEST_UP_TIMEOUT:-30} s (state '$st')"; break; }
    sleep 0.05
  done
  if [ "$st" != idle ]; then _slurm_up_failed "$name" "$T" "$st"; return 1; fi
  SLURM_UP_MS=$(_slurm_ms_since "$t0")
  echo "slurm_cluster_up $name: ready in ${SLURM_UP_MS} ms: SLURM_CONF_$var=$conf" \
       "(ctld :$ctld_port, slurmd :$slurmd_port, gpu $spec)"
}

_slurm_up_failed() {  # NAME DIR WHY: report, stop what did start, keep the logs
  local name=$1 T=$2 why=$3
  echo "slurm_cluster_up $name: failed: $why; logs kept in $T/log" >&2
  tail -n 5 "$T"/log/*.stdout >&2 2>/dev/null
  SLURM_TEST_KEEP=1 slurm_cluster_down "$name" >&2
}

_slurm_stop_pid() {  # PID WHAT: SIGTERM, wait up to 10 s, then SIGKILL
  local pid=$1 what=$2 i t0; t0=$(date +%s%N)
  _slurm_alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 1 200); do _slurm_alive "$pid" || break; sleep 0.05; done
  if _slurm_alive "$pid"; then
    echo "$what ($pid) ignored SIGTERM for 10 s; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null   # reap it when it is our child
  echo "  stopped $what ($pid) in $(_slurm_ms_since "$t0") ms"
}

_slurm_our_pids() {  # CONF [stepd|jobs]: live processes of that cluster's jobs: SLURM_CONF=CONF
  # exactly in their environment (jobs inherit the submitter's) plus SLURM_JOB_ID, or comm
  # slurmstepd. "stepd": the slurmstepds only; "jobs": the job processes only.
  local conf=$1 only=${2:-} e p comm
  # shellcheck disable=SC2013  # /proc paths have no spaces
  for e in $(grep -lzxF "SLURM_CONF=$conf" /proc/[0-9]*/environ 2>/dev/null); do
    p=${e#/proc/}; p=${p%/environ}
    { [ "$p" = "$$" ] || [ "$p" = "$BASHPID" ]; } && continue
    _slurm_alive "$p" || continue
    comm=$(cat "/proc/$p/comm" 2>/dev/null)
    if [ "$comm" = slurmstepd ]; then
      [ "$only" = jobs ] || echo "$p"
    elif [ "$only" != stepd ] && grep -qz '^SLURM_JOB_ID=' "$e" 2>/dev/null; then
      echo "$p"
    fi
  done
}

_slurm_active_jobs() {  # CONF: ids of jobs not finished yet (pending, running, completing, ...)
  SLURM_CONF=$1 timeout 5 squeue -h -o %i 2>/dev/null
}

slurm_cluster_down() {  # NAME: stop jobs, then the daemons; remove the dir unless SLURM_TEST_KEEP=1
  local name=${1:?usage: slurm_cluster_down NAME} var T conf i jobs p t0; t0=$(date +%s%N)
  SLURM_DOWN_MS=
  var=$(_slurm_var "$name")
  T=$(_slurm_dir_of "$name")
  if [ -z "$T" ]; then echo "slurm_cluster_down: cluster '$name' is not up" >&2; return 0; fi
  conf=$T/etc/slurm.conf
  # 1. Jobs first. slurmstepd and the job's processes are not children of slurmd; they outlive
  #    the daemons, and a slurmstepd that cannot report its job's end retries forever and
  #    ignores SIGTERM. So: cancel, wait for the jobs AND their slurmstepds to be gone.
  if _slurm_alive "$(cat "$T/run/slurmctld.bgpid" 2>/dev/null)"; then
    jobs=$(_slurm_active_jobs "$conf")
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      SLURM_CONF=$conf scancel $jobs 2>/dev/null || true   # TERM to all of the job; KILL after KillWait
      for i in $(seq 1 50); do [ -z "$(_slurm_active_jobs "$conf")" ] && break; sleep 0.1; done
      if [ -n "$(_slurm_active_jobs "$conf")" ]; then
        # Something ignored TERM. Do not wait for KillWait (30 s): a second scancel is refused
        # ("already completing"), so SIGKILL the job processes by PID; slurmstepd then ends.
        for p in $(_slurm_our_pids "$conf" jobs); do kill -KILL "$p" 2>/dev/null; done
        for i in $(seq 1 100); do [ -z "$(_slurm_active_jobs "$conf")" ] && break; sleep 0.1; done
      fi
    fi
    # The controller may call a job done while its slurmstepd is still finishing: wait for the
    # slurmstepds (up to 15 s). Not for job processes that left the process group (setsid):
    # Slurm has already let go of those; step 3 kills them.
    local deadline=$(( $(date +%s) + 15 ))
    while [ -n "$(_slurm_our_pids "$conf" stepd)" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.05; done
  fi
  # 2. Daemons, by the PIDs we started, in reverse order (slurmctld's slurmscriptd goes with it).
  _slurm_stop_pid "$(cat "$T/run/slurmd.bgpid" 2>/dev/null)" "$name slurmd"
  _slurm_stop_pid "$(cat "$T/run/slurmctld.bgpid" 2>/dev/null)" "$name slurmctld"
  _slurm_stop_pid "$(cat "$T/run/munged.bgpid" 2>/dev/null)" "$name munged"
  # 3. Leak guard: whatever of this cluster is still alive (a job child that left the process
  #    group, a stuck slurmstepd) gets SIGKILL, by PID. Other clusters have another SLURM_CONF.
  for p in $(_slurm_our_pids "$conf"); do
    echo "slurm_cluster_down $name: SIGKILL leftover $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" >&2
    kill -KILL "$p" 2>/dev/null
  done
  unset "SLURM_DIR_$var" "SLURM_CONF_$var"
  if [ "${SLURM_TEST_KEEP:-0}" = 1 ]; then
    echo "  kept $T"
  else
    rm -rf "$T"
  fi
  SLURM_DOWN_MS=$(_slurm_ms_since "$t0")
  echo "slurm_cluster_down $name: done in ${SLURM_DOWN_MS} ms"
}
