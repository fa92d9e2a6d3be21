#!/usr/bin/env bash
# A single-node Slurm cluster on localhost for the tests marked `slurm` (and for trying
# `oreline launch slurm --submit` / `data.executor = "slurm"` by hand).
#
#   scripts/local-slurm.sh start    install slurm-wlm + munge when root and missing, then start
#                                   munged, slurmctld and slurmd in a private state folder
#   scripts/local-slurm.sh stop     stop exactly those three daemons (by the pids they wrote)
#   scripts/local-slurm.sh env      print `export SLURM_CONF=...` for the client commands
#
# Everything lives under $ORELINE_SLURM_DIR (default /tmp/oreline-slurm-$UID): the munge key and
# socket, slurm.conf, the daemons' pid files, logs and spool. Nothing in /etc is read or written,
# so the cluster does not meet a system Slurm, and `stop` touches no other process. Client commands
# find this cluster through SLURM_CONF (`eval "$(scripts/local-slurm.sh env)"`).
#
# The node declares ORELINE_SLURM_CPUS CPUs (default: at least 8, more than this machine may
# have; `SlurmdParameters=config_overrides` lets slurmd accept it), so that a 2-rank training job
# and a few array tasks can be scheduled side by side on a small CI machine; the tasks then share
# the real cores.
#
# ORELINE_SLURM_ACCOUNTING=1 adds job accounting, so that `sacct` works: a private MariaDB server
# (data folder, socket and port of its own in the state folder) and slurmdbd; mariadb-server and
# slurmdbd are installed like the others. Without it (the default: it starts faster) there is no
# sacct, and every job end (each requeue included) is written to $STATE/jobcomp.txt.
set -euo pipefail

STATE="${ORELINE_SLURM_DIR:-/tmp/oreline-slurm-$(id -u)}"
CTLD_PORT="${ORELINE_SLURM_PORT:-6917}"
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
MARIADB_PORT=$((CTLD_PORT + 3))
ACCOUNTING="${ORELINE_SLURM_ACCOUNTING:-0}"

log() { echo "[local-slurm] $*" >&2; }

install_if_missing() {
  local packages="slurm-wlm munge" commands="slurmctld slurmd munged sbatch" missing=0 c
  if [ "$ACCOUNTING" = 1 ]; then
    packages="$packages slurmdbd mariadb-server"
    commands="$commands slurmdbd mariadbd mariadb-install-db"
  fi
  for c in $commands; do command -v "$c" >/dev/null || missing=1; done
  [ "$missing" = 0 ] && return
  if [ "$(id -u)" != 0 ]; then
    log "one of $commands is not installed and this is not root: install $packages"
    exit 1
  fi
  log "installing $packages (apt)"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages >/dev/null ||
    { apt-get update -q >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages >/dev/null; }
}

start_accounting() {
  # a private MariaDB without grant tables: only slurmdbd reaches it, on 127.0.0.1
  if [ ! -d "$STATE/db/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$STATE/db" --user="$(id -un)" >"$STATE/mariadb-install.log" 2>&1
  fi
  setsid mariadbd --no-defaults --datadir="$STATE/db" --socket="$STATE/mariadb.sock" --port="$MARIADB_PORT" \
    --bind-address=127.0.0.1 --pid-file="$STATE/mariadb.pid" --log-error="$STATE/mariadb.err" \
    --user="$(id -un)" --skip-grant-tables </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 120); do
    [ -S "$STATE/mariadb.sock" ] && [ -s "$STATE/mariadb.pid" ] && break
    sleep 0.25
  done
  printf '%s\n' "AuthType=auth/munge" "AuthInfo=socket=$STATE/munge/munge.socket" "DbdHost=localhost" \
    "DbdPort=$DBD_PORT" "SlurmUser=$(id -un)" "PidFile=$STATE/slurmdbd.pid" "LogFile=$STATE/slurmdbd.log" \
    "StorageType=accounting_storage/mysql" "StorageHost=127.0.0.1" "StoragePort=$MARIADB_PORT" \
    "StorageUser=$(id -un)" "StorageLoc=slurm_acct_db" >"$STATE/slurmdbd.conf"
  chmod 600 "$STATE/slurmdbd.conf"
  slurmdbd # reads the slurmdbd.conf beside $SLURM_CONF
  local until=$((SECONDS + 60))
  until sacctmgr -i add cluster oreline >/dev/null 2>&1 || sacctmgr -n list cluster 2>/dev/null | grep -q oreline; do
    if [ "$SECONDS" -ge "$until" ]; then
      log "slurmdbd did not answer within 60 s: see $STATE/slurmdbd.log and $STATE/mariadb.err"
      exit 1
    fi
    sleep 0.5
  done
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local cpus="${ORELINE_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}"
  local mem_mb
  mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  cat >"$STATE/slurm.conf" <<EOF
# written by scripts/local-slurm.sh: a one-node cluster for oreline's tests
ClusterName=oreline
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket,cred_expire=10
# cred_expire is also the delay before a requeued job may start again (default 120 s): short for tests
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
JobAcctGatherType=jobacct_gather/none
$(if [ "$ACCOUNTING" = 1 ]; then
    printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort=%s\nAccountingStoragePass=%s\n' "$DBD_PORT" "$STATE/munge/munge.socket"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi)
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
JobRequeue=1
MaxArraySize=${ORELINE_SLURM_MAX_ARRAY:-1001}
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
PropagateResourceLimits=NONE
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start() {
  install_if_missing
  mkdir -p "$STATE"/{munge,ctld,spool}
  chmod 700 "$STATE" "$STATE/munge"
  export SLURM_CONF="$STATE/slurm.conf"
  if pid_alive "$STATE/slurmctld.pid" && pid_alive "$STATE/slurmd.pid" && pid_alive "$STATE/munge/munged.pid"; then
    log "already running in $STATE"
  else
    stop quiet
    write_conf
    if [ ! -s "$STATE/munge/munge.key" ]; then
      head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
      chmod 400 "$STATE/munge/munge.key"
    fi
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
      --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
      --seed-file="$STATE/munge/munged.seed"
    if [ "$ACCOUNTING" = 1 ]; then start_accounting; fi
    # job ids continue from the state an earlier start saved (the accounting database keeps them)
    slurmctld
    slurmd
  fi
  # ready when the node is idle (or mixed/allocated from a job submitted before `start` returned)
  for _ in $(seq 1 120); do
    state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1 || true)
    case "$state" in
      idle* | mixed* | allocated*)
        log "up in $STATE (node localhost: $state); client commands need SLURM_CONF=$SLURM_CONF"
        return 0
        ;;
      down* | drain*)
        scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
        ;;
    esac
    sleep 0.5
  done
  log "the cluster did not come up within 60 s: see $STATE/slurmctld.log and $STATE/slurmd.log"
  tail -n 20 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2 || true
  exit 1
}

stop() {
  local pf pid
  for pf in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/slurmdbd.pid" "$STATE/mariadb.pid" \
    "$STATE/munge/munged.pid"; do
    if pid_alive "$pf"; then
      pid=$(cat "$pf")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pf"
  done
  [ "${1:-}" = quiet ] || log "stopped (state kept in $STATE)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$STATE/slurm.conf" ;;
  *)
    echo "usage: $0 start|stop|env" >&2
    exit 2
    ;;
esac
