#!/usr/bin/env bash
# The test suite: creates or reuses .venv, installs what the browser test needs, runs pytest.
# The default tier reads the samples embedded in the package; with ORELINE_SAMPLES set to the larger
# collection (.ci/run sets ../shared/data) the tests marked `extended` run too.
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
exec "$repo/.venv/bin/python" -m pytest "$@"
