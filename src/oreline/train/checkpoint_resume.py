"""What resume needs besides tensors: RNG states as JSON, and the rule for a config that changed.

- `capture_rng_state()` / `restore_rng_state(d)`: Python, numpy, torch CPU and every CUDA device's
  generator; byte states are base64 so the whole thing lives in meta.json.
- `check_resume_compatible(meta, current_config, allow_keys)`: a resume under a different config is
  refused, listing the differing dotted keys (`oreline.config.diff_keys`), unless
  `--allow-config-change KEY` names them. Model and tokenizer keys, a different `model_args` or
  tokenizer fingerprint are refused even when named: the saved tensors would not fit the model,
  or token ids would mean other strings.

Re-exported by `oreline.train.checkpoint`.
"""

from __future__ import annotations

import base64
import logging
import random

import numpy as np
import torch

from oreline.config import diff_keys
from oreline.errors import CheckpointError

log = logging.getLogger("oreline.checkpoint")

NEVER_ALLOWED = {
    "model.": "the model shape would not match the saved tensors",
    "tokenizer.": "token ids would mean different strings than the model learned",
}


# ---------------------------------------------------------------------------------------------
# RNG states as JSON


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture_rng_state() -> dict:
    """Python, numpy, torch CPU and every CUDA device's generator, as JSON-able values."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    state = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": {
            "name": np_name,
            "keys_b64": base64.b64encode(np_keys.astype("<u4").tobytes()).decode(),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch_cpu": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of `capture_rng_state` (CUDA states are restored for the devices present)."""
    v, s, g = state["python"]
    random.setstate((v, tuple(s), g))
    n = state["numpy"]
    keys = np.frombuffer(base64.b64decode(n["keys_b64"]), dtype="<u4").astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(_unb64(state["torch_cpu"]))
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            log.warning(
                "checkpoint holds RNG states of %d CUDA devices, %d present: restoring the common ones",
                len(cuda),
                torch.cuda.device_count(),
            )
        for i, s64 in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(_unb64(s64), device=i)


# ---------------------------------------------------------------------------------------------
# resume compatibility


def check_resume_compatible(
    meta: dict,
    current_config: dict,
    allow_keys: list[str] | None = None,
    *,
    fingerprints: dict[str, str] | None = None,
    model_args: dict | None = None,
) -> list[str]:
    """Refuse to resume under a different config unless the differing keys are allowed.

    `allow_keys` (from --allow-config-change) names dotted keys or sections ("train.optim" allows
    "train.optim.lr"). Model and tokenizer keys are never allowed; nor are a different model_args or
    tokenizer fingerprint (when given). A different data fingerprint is allowed only if "data" is named.
    Returns the differing keys that were allowed (for the run's event log).
    """
    allow = list(allow_keys or [])
    saved = meta.get("config")
    diffs = diff_keys(saved, current_config) if isinstance(saved, dict) else []

    def allowed(key: str) -> bool:
        return any(key == a or key.startswith(a + ".") for a in allow)

    never = [(k, why) for k in diffs for prefix, why in NEVER_ALLOWED.items() if k.startswith(prefix)]
    if model_args is not None and meta.get("model_args") not in (None, model_args):
        never.append(
            (
                "model_args " + ", ".join(diff_keys(meta["model_args"], model_args)),
                "the model shape would not match the saved tensors",
            )
        )
    fps = fingerprints or {}
    saved_tok = meta.get("tokenizer_fingerprint")
    if fps.get("tokenizer") and saved_tok and fps["tokenizer"] != saved_tok:
        never.append(
            (
                f"tokenizer fingerprint {saved_tok[:12]}… → {fps['tokenizer'][:12]}…",
                NEVER_ALLOWED["tokenizer."],
            )
        )
    if never:
        what = "; ".join(f"{k} ({why})" for k, why in never)
        raise CheckpointError(
            f"cannot resume from step {meta.get('step')}: {what}",
            "start a new run (another run.name, or --resume none), or undo the change",
        )
    refused = [k for k in diffs if not allowed(k)]
    saved_data = meta.get("data_fingerprint")
    if fps.get("data") and saved_data and fps["data"] != saved_data and not allowed("data"):
        refused.append("data (token shards differ from the ones the checkpoint was trained on)")
    if refused:
        raise CheckpointError(
            f"the config differs from the checkpoint's (step {meta.get('step')}) in: {', '.join(refused)}",
            "undo the change, or allow it with --allow-config-change "
            + " --allow-config-change ".join(k.split(" ")[0] for k in refused),
        )
    return [k for k in diffs if allowed(k)]
