"""`oreline tokens verify`: the full check of a token folder, run once, not at every launch.

A training launch checks each shard's 128-byte header only (tokens/loader.py), so its start-up
does not grow with the corpus. The checks that read every byte run here instead: for every shard
of the manifest, its header, size, tokenizer fingerprint, manifest counts, the sha256 of the whole
file against the manifest, its document index and every token id against its vocabulary
(`shards.verify_shard`). `oreline tokenize` computes the sha256 from the finished file, so a
folder fresh from tokenize needs no verify; run it after copying or moving shards, or when a disk
is suspect. A damaged shard is reported with the error the loader would raise, and the rest are
still checked.

Shards are checked on `workers` threads: hashing and reading release the GIL, so a folder is
checked at the disk's speed rather than one core's sha256 (~0.6-1.5 GB/s).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from oreline.errors import OrelineError
from oreline.tokens import shards as fmt
from oreline.tokens.tokenize import read_manifest


def verify_tokens(tokens_dir: str | Path, workers: int = 4, progress=None) -> dict:
    """Check every shard of `tokens_dir`; {"shards", "bytes", "tokens", "bad": [(name, error)], "seconds"}.
    `progress(done, total)` is called after each shard."""
    folder = Path(tokens_dir)
    manifest = read_manifest(folder)
    fp = manifest["tokenizer_fingerprint"]
    entries = manifest["shards"]
    t0 = time.perf_counter()

    def check(entry: dict) -> str | None:
        try:
            fmt.verify_shard(folder / entry["name"], fp, entry, manifest["bos_id"], manifest["eos_id"])
        except OrelineError as exc:
            return str(exc)
        return None

    bad: list[tuple[str, str]] = []
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for done, (entry, error) in enumerate(zip(entries, pool.map(check, entries), strict=True), 1):
            if error is not None:
                bad.append((entry["name"], error))
            if progress is not None:
                progress(done, len(entries))
    return {
        "shards": len(entries),
        "bytes": sum(e["bytes"] for e in entries),
        "tokens": sum(e["tokens"] for e in entries),
        "bad": bad,
        "seconds": time.perf_counter() - t0,
    }


def verify_cli(tokens_dir: Path, workers: int, console) -> int:
    """Print the result; the exit code: 0 when every shard passes, 1 when any is damaged."""
    result = verify_tokens(tokens_dir, workers)
    for _name, error in result["bad"]:
        console.print(f"[bold red]damaged:[/] {error}", soft_wrap=True)
    gb = result["bytes"] / 1e9
    speed = gb / result["seconds"] if result["seconds"] > 0 else 0.0
    summary = (
        f"{result['shards']:,} shards, {result['tokens']:,} tokens, {gb:,.2f} GB checked in "
        f"{result['seconds']:.1f} s ({speed:.2f} GB/s)"
    )
    if result["bad"]:
        console.print(
            f"[bold red]{len(result['bad'])} of {result['shards']:,} shards are damaged[/] ({summary}): "
            f"re-run oreline tokenize to rebuild them, or copy them again from the source",
            soft_wrap=True,
        )
        return 1
    console.print(f"[green]all token shards verified[/]: {summary}", soft_wrap=True)
    return 0
