"""RNG states as JSON: Python, numpy, torch CPU and every CUDA device's generator.

A full checkpoint holds every rank's states (rank 0's in meta.json, the others' in
`rng-rank0000N.json`), so a resumed run draws the same random numbers as one that never stopped.
Byte states are base64, so everything stays JSON: nothing of a checkpoint is unpickled.
"""

from __future__ import annotations

import base64
import logging
import random

import numpy as np
import torch

log = logging.getLogger("oreline.checkpoint")


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
