#!/usr/bin/env bash
# The main job: creates or reuses .venv, then runs crawl → data → tokenizer → train → eval →
# export → report into runs/demo/ on the sample data (ORELINE_SAMPLES, default the embedded samples/).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/venv.sh"
cd "$repo"
exec "$repo/.venv/bin/oreline" run -c configs/demo.toml "$@"
