"""The perplexity step inside `oreline data`: scores in phase 1, the run's own cut-offs, buckets in phase 3.

Runs run_data on real sample WARCs with a reference model trained here, and checks the funnel in
stats.json (steps, reasons, consistency), the cut-offs against the run's own scored documents,
the metadata of kept and rejected documents, the printed funnel, and the llama kind from config.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from oreline.config import Config
from oreline.data.pipeline.run import print_funnel, run_data
from oreline.quality.reference_lm import train_reference

WARCS = [
    "dolma-wget-2024/sample-0000.warc.gz",
    "dolma-wget-2024/sample-0001.warc.gz",
    "commoncrawl-samples/resiliparse-CC-MAIN-2020-34-excerpt.warc.gz",
]


def prose_files(samples: Path, folder: Path, names: list[str]) -> list[str]:
    out = []
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        for name in names:
            (folder / name).write_text(zf.read(f"gutenberg/{name}").decode("latin-1"), encoding="utf-8")
            out.append(str(folder / name))
    return out


@pytest.fixture(scope="module")
def ngram_ref(samples, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ngram-ref")
    train_reference(
        prose_files(samples, tmp_path_factory.mktemp("src"), ["austen-emma.txt"]), out, kind="ngram"
    )
    return out


def run(samples: Path, out: Path, **quality) -> dict:
    cfg = Config.model_validate({"data": {"quality": quality, "workers": 1}})
    return run_data(
        [str(samples / "web-archives" / w) for w in WARCS],
        out,
        cfg,
        workers=1,
        console=Console(file=io.StringIO()),
    )


def rows(folder: Path) -> list[dict]:
    return [r for p in sorted(folder.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_buckets_cut_with_the_runs_own_cutoffs(samples, ngram_ref, tmp_path):
    stats = run(
        samples, tmp_path / "out", perplexity_model=str(ngram_ref), perplexity_keep_buckets=["head", "middle"]
    )
    assert stats == json.loads((tmp_path / "out" / "stats.json").read_text())
    names = [s["name"] for s in stats["steps"]]
    assert (
        names.index("quality:perplexity") + 1
        == names.index("quality:perplexity_buckets")
        < names.index("dedup")
    )
    for a, b in zip(stats["steps"], stats["steps"][1:], strict=False):
        assert a["docs_out"] == b["docs_in"], (a["name"], b["name"])
    scored = next(s for s in stats["steps"] if s["name"] == "quality:perplexity")
    buckets = next(s for s in stats["steps"] if s["name"] == "quality:perplexity_buckets")
    assert scored["docs_in"] >= 20 and scored["seconds"] > 0
    assert set(scored["dropped"]) <= {"perplexity:no_tokens"}
    assert set(buckets["dropped"]) == {"perplexity:tail"} and buckets["dropped"]["perplexity:tail"] > 0

    # the cut-offs are the p30/p60 of this run's own phase-1 survivors (all of them: sample ≥ docs)
    info = stats["perplexity"]
    assert info["mode"] == "buckets" and info["scored_docs"] == info["sample_docs"] == scored["docs_out"]
    docs = rows(tmp_path / "out" / "docs")
    rejects = rows(tmp_path / "out" / "rejects")
    later = [
        json.loads(r["metadata"]) for r in rejects if r["step"] in ("quality:perplexity_buckets", "dedup")
    ]
    ppl = [d["perplexity"] for d in docs] + [m["perplexity"] for m in later]
    assert len(ppl) == scored["docs_out"]
    assert info["cutoffs"] == pytest.approx([np.percentile(ppl, 30), np.percentile(ppl, 60)])
    lo, hi = info["cutoffs"]
    assert all(d["perplexity"] <= hi for d in docs)
    assert {json.loads(d["metadata"])["perplexity_bucket"] for d in docs} <= {"head", "middle"}
    tails = [r for r in rejects if r["step"] == "quality:perplexity_buckets"]
    assert all(
        r["reason"] == "perplexity:tail" and json.loads(r["metadata"])["perplexity"] > hi for r in tails
    )
    paras = json.loads(docs[0]["metadata"])["perplexity_paragraphs"]
    assert len(paras) == len([x for x in docs[0]["text"].split("\n") if x.strip()])

    printed = Console(file=io.StringIO(), width=200)
    print_funnel(stats, printed)
    text = printed.file.getvalue()
    assert "quality:perplexity_buckets" in text and "perplexity:tail" in text
    assert f"head ≤ {lo:,.1f} < middle ≤ {hi:,.1f} < tail" in text


def test_llama_reference_from_config_with_an_absolute_cutoff(samples, tmp_path):
    import torch

    ref = tmp_path / "llama-ref"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # a few steps are enough to check the wiring; the ranking is tested in test_perplexity.py
        meta = train_reference(
            prose_files(samples, tmp_path, ["austen-persuasion.txt"]),
            ref,
            kind="llama",
            vocab_size=512,
            dim=64,
            n_layers=1,
            n_heads=2,
            n_kv_heads=1,
            ffn_dim=128,
            seq_len=64,
            micro_batch=8,
            steps=30,
            max_train_chars=300_000,
        )
    finally:
        torch.set_num_threads(threads)
    assert meta["kind"] == "llama" and meta["steps"] == 30
    # first keep everything to see this run's scores, then cut at their median
    everything = run(samples, tmp_path / "all", perplexity_model=str(ref), perplexity_max=1e300)
    ppl = [d["perplexity"] for d in rows(tmp_path / "all" / "docs")] + [  # every document the step kept
        json.loads(r["metadata"])["perplexity"]
        for r in rows(tmp_path / "all" / "rejects")
        if r["step"] == "dedup"
    ]
    median = float(
        f"{np.median(ppl):g}"
    )  # the reason string prints the cut-off with %g: make them the same number
    stats = run(samples, tmp_path / "out", perplexity_model=str(ref), perplexity_max=median)
    names = [s["name"] for s in stats["steps"]]
    assert "quality:perplexity" in names and "quality:perplexity_buckets" not in names
    scored = next(s for s in stats["steps"] if s["name"] == "quality:perplexity")
    before = next(s for s in everything["steps"] if s["name"] == "quality:perplexity")
    assert scored["docs_in"] == before["docs_in"] >= 20
    cut = scored["dropped"][f"perplexity:>{median:g}"]
    assert cut == sum(p > float(f"{median:g}") for p in ppl) and 0 < cut < scored["docs_in"]
    assert stats["perplexity"] == {
        "mode": "max",
        "perplexity_max": median,
        "model": str(ref),
        "model_fingerprint": meta["fingerprint"],
    }
    assert all(d["perplexity"] <= median for d in rows(tmp_path / "out" / "docs"))
