"""What `oreline checkpoint ls | verify | sign | inspect` do and print: tables from meta.json,
checksums and DCP metadata.

`inspect` reads DCP's `.metadata` (tensor names, global shapes, dtypes) only after the checkpoint
verified, and then through the allow-listed unpickler (`metadata`), since that index is a
pickle. `verify` says what its checks stand for: without ORELINE_CHECKPOINT_KEY, checksums detect
corruption, not forgery.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from oreline.errors import CheckpointError
from oreline.train.checkpoint.format import (
    CHECKSUMS,
    META,
    checkpoints_root,
    dir_bytes,
    latest_problem,
    list_checkpoints,
    read_latest,
    read_meta,
)
from oreline.train.checkpoint.load import resolve_checkpoint
from oreline.train.checkpoint.metadata import read_dcp_metadata
from oreline.train.checkpoint.signature import KEY_ENV, signing_key
from oreline.train.checkpoint.verify import sign_checkpoint, verify_checkpoint


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def print_checkpoints(run_dir: Path, console) -> None:
    """Table: name, kind, step, tokens, size, validity, latest marker."""
    from rich.table import Table

    root = checkpoints_root(run_dir)
    entries = list_checkpoints(root)
    note = latest_problem(root)
    if note:
        console.print(f"[yellow]{note}: no checkpoint is marked latest; resume takes the newest valid one[/]")
    if not entries:
        console.print(f"no checkpoints under {root}")
        return
    latest = read_latest(root)
    table = Table(title=f"checkpoints in {root}")
    for col in ("name", "kind", "step", "tokens", "size", "valid", "latest"):
        table.add_column(col, justify="right" if col in ("step", "tokens", "size") else "left")
    for e in entries:
        meta = read_meta(e.path) or {}
        ok, problems = verify_checkpoint(e.path)
        tokens = meta.get("tokens_seen")
        table.add_row(
            e.path.name,
            e.kind,
            str(e.step),
            f"{tokens:,}" if isinstance(tokens, int) else "-",
            _fmt_bytes(dir_bytes(e.path)),
            "[green]ok[/]" if ok else f"[red]{'; '.join(problems)}[/]",
            "←" if e.path.name == latest else "",
        )
    console.print(table)


def verify_cli(path: Path, console) -> int:
    """Verify one checkpoint or all under a run; 0 when all are valid, 1 otherwise."""
    path = Path(path)
    targets = (
        [path]
        if (path / CHECKSUMS).is_file() or (path / META).is_file()
        else [e.path for e in list_checkpoints(path)]
    )
    # a run's `latest` that names a missing folder (or holds no checkpoint name) is a problem too:
    # resume then falls back to the newest valid checkpoint, which may be older than the user thinks
    note = None if targets == [path] else latest_problem(checkpoints_root(path))
    if note:
        console.print(f"[red]INVALID[/] {note}")
    if not targets:
        console.print(f"[red]no checkpoints found under {path}[/]")
        return 1
    bad = 1 if note else 0
    for t in targets:
        ok, problems = verify_checkpoint(t)
        bad += not ok
        console.print(
            f"{'[green]ok[/]     ' if ok else '[red]INVALID[/]'} {t}"
            + ("" if ok else f": {'; '.join(problems)}")
        )
    console.print(
        f"{len(targets) - bad + bool(note)} of {len(targets)} checkpoints valid"
        + ("; `latest` names no valid checkpoint" if note else "")
    )
    if signing_key():
        console.print(f"signatures checked with the key in {KEY_ENV} (unsigned checkpoints count as invalid)")
    else:
        console.print(
            f"note: checksums detect corruption, not forgery; set {KEY_ENV} to sign checkpoints "
            "and refuse unsigned ones (docs/checkpoint-security.md)"
        )
    return 1 if bad else 0


def sign_cli(path: Path, console) -> int:
    """Sign one checkpoint or every complete one under a run with ORELINE_CHECKPOINT_KEY; 1 if any failed."""
    path = Path(path)
    targets = (
        [path]
        if (path / CHECKSUMS).is_file() or (path / META).is_file()
        else [e.path for e in list_checkpoints(path) if e.kind != "incomplete"]
    )
    if not targets:
        console.print(f"[red]no checkpoints found under {path}[/]")
        return 1
    bad = 0
    for t in targets:
        try:
            sign_checkpoint(t)
            console.print(f"[green]signed[/] {t}")
        except CheckpointError as exc:
            bad += 1
            console.print(f"[red]NOT SIGNED[/] {exc}")
    return 1 if bad else 0


def inspect_cli(path: Path, console) -> int:
    """Meta summary, fingerprints and the tensors (names, shapes, dtypes) of one checkpoint; 1 if invalid."""
    from rich.table import Table

    path = resolve_checkpoint(path)
    meta = read_meta(path) or {}
    ok, problems = verify_checkpoint(path)
    console.print(
        f"[bold]{path}[/]  {'[green]valid[/]' if ok else '[red]INVALID: ' + '; '.join(problems) + '[/]'}"
    )
    for key in (
        "kind",
        "step",
        "tokens_seen",
        "lr_multiplier",
        "world_size",
        "time",
        "torch_version",
        "config_fingerprint",
        "tokenizer_fingerprint",
        "data_fingerprint",
        "tokenizer_dir",
    ):
        if key in meta:
            console.print(f"  {key:22s} {meta[key]}")
    if "model_args" in meta:
        console.print(f"  {'model_args':22s} {json.dumps(meta['model_args'], sort_keys=True)}")
    if isinstance(meta.get("stability"), dict) and "counters" in meta["stability"]:
        console.print(f"  {'stability':22s} {meta['stability']['counters']}")
    lineage = meta.get("init_from")
    if isinstance(lineage, dict):  # the run started from these weights (train.init_from)
        console.print(
            f"  {'init_from':22s} {lineage.get('path')} ({lineage.get('kind')}, step {lineage.get('step')}, "
            f"weights sha256 {str(lineage.get('weights_sha256'))[:16]}…)",
            highlight=False,
        )
    if not ok:
        return 1  # the tensor index of an invalid checkpoint is not parsed
    table = Table(title="tensors")
    for col in ("name", "shape", "dtype"):
        table.add_column(col)
    if meta.get("kind") == "model_only":
        from safetensors import safe_open

        try:
            with safe_open(str(path / "model.safetensors"), "pt") as fh:
                for k in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    sl = fh.get_slice(k)
                    table.add_row(k, str(tuple(sl.get_shape())), str(sl.get_dtype()))
        except Exception as exc:  # safetensors parses a JSON header: it never unpickles
            raise CheckpointError(
                f"{path / 'model.safetensors'} is not a readable safetensors file ({exc})",
                "use another checkpoint, or re-export this one",
            ) from None
        console.print(table)
        return 0
    md = read_dcp_metadata(path)
    optim_n, optim_bytes = 0, 0
    for key, tmd in sorted(md.state_dict_metadata.items()):
        if not hasattr(tmd, "size"):
            continue
        if key.startswith("model."):
            table.add_row(
                key.removeprefix("model."),
                str(tuple(tmd.size)),
                str(tmd.properties.dtype).removeprefix("torch."),
            )
        else:
            optim_n += 1
            optim_bytes += torch.Size(tmd.size).numel() * tmd.properties.dtype.itemsize
    console.print(table)
    console.print(f"  optimizer state: {optim_n} tensors, {_fmt_bytes(optim_bytes)}")
    return 0
