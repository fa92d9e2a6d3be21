#!/usr/bin/env bash
# The test suite: creates or reuses .venv, installs what the browser test needs, starts a private
# single-node Slurm cluster for the tests marked `slurm`, runs pytest, stops the cluster.
# The default tier reads the samples embedded in the package; with ORELINE_SAMPLES set to the larger
# collection (.ci/run sets ../shared/data) the tests marked `extended` run too.
#
# Slurm: when SLURM_CONF names a cluster already (.ci/run starts one and runs this script beside
# itself), the tests use that one. Otherwise this script starts one of its own as .ci/run does
# (scripts/local-slurm.sh: a state folder from mktemp, a random port, accounting with a private
# MariaDB, the packages installed with apt when root and missing) and stops exactly that one however
# pytest ends; a cluster already running on this machine (/tmp/oreline-slurm-$UID, port 6917) is
# neither used nor touched. When it cannot start one, the Slurm tests are skipped and the skip
# reason says why. ORELINE_TEST_SLURM=0 starts none (the tests marked slurm then skip).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/venv.sh"
# The report test renders report.html in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "[oreline] installing chromium for the report browser test" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) >&2 \
    || echo "[oreline] chromium install failed; the browser test will skip" >&2
fi
cd "$repo"

slurm_state=""
stop_slurm() {
  if [ -n "$slurm_state" ]; then
    ORELINE_SLURM_DIR="$slurm_state" bash "$repo/scripts/local-slurm.sh" stop || true
    rm -rf "$slurm_state"
  fi
}
if [ -z "${SLURM_CONF:-}" ] && [ "${ORELINE_TEST_SLURM:-1}" != 0 ]; then
  slurm_state="$(mktemp -d /tmp/oreline-test-slurm.XXXXXX)"
  trap stop_slurm EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  export ORELINE_SLURM_DIR="$slurm_state"
  export ORELINE_SLURM_PORT=$((20000 + RANDOM % 20000))
  export ORELINE_SLURM_ACCOUNTING=1 # slurmdbd + a private MariaDB: sacct shows each requeue of the training test
  echo "[oreline] starting a private Slurm cluster in $slurm_state for the tests marked slurm" >&2
  if bash scripts/local-slurm.sh start 2>"$slurm_state/start.log"; then
    eval "$(bash scripts/local-slurm.sh env)"
    export SLURM_CONF
  else
    # the tests marked slurm are skipped with this reason (tests/conftest.py, slurm_cluster)
    why="$(grep -v '^\s*$' "$slurm_state/start.log" | tail -n 1 | cut -c1-300)"
    export ORELINE_SLURM_UNAVAILABLE="scripts/test.sh could not start a private cluster: ${why:-see $slurm_state/start.log}"
    echo "[oreline] $ORELINE_SLURM_UNAVAILABLE; the tests marked slurm will skip" >&2
    cat "$slurm_state/start.log" >&2
  fi
fi
# Two pytest-xdist workers unless the caller chose (-n N, --numprocesses, -p no:xdist): most tests wait
# on processes they start (torchrun ranks, Ray, Slurm jobs, servers), so one worker leaves a core idle
# much of the time; a test file stays on one worker (--dist loadfile), so its module fixtures are built
# once (tests/train alone: 814 s serial, 516 s on two workers; docs/measurements.md).
workers=(-n 2 --dist loadfile)
for arg in "$@"; do
  case "$arg" in -n | -n[0-9]* | --numprocesses* | no:xdist) workers=() ;; esac
done
rc=0
"$repo/.venv/bin/python" -m pytest "${workers[@]}" "$@" || rc=$?
exit "$rc"
