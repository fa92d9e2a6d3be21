"""A manufactured but realistic run directory for the doctor and report tests.

The data, tokenizer and token layers are REAL: synthetic documents go into a Parquet shard, a
real BPE tokenizer is trained on them (oreline.tokens.train_bpe) and real token shards and a
manifest are written (oreline.tokens.tokenize), so fingerprints and the shard format are the
ones those layers produce. The training artifacts (metrics.jsonl, checkpoint metas) follow the
documented record contract with plausible values for a 200-step debug run: loss falling from
~9 to ~3.4, warmup + cosine lr, grad norm decaying, ~2,000 tokens/s, data wait ~3%.

Loaded from tests/doctor/conftest.py and tests/report/conftest.py by file path (pytest runs
with --import-mode=importlib, so test folders are not packages).
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_EN = (
    "the model reads data from many sources and learns which word comes next in a sentence while "
    "training runs on small machines with careful checks of every step so that numbers can be traced "
    "back to bytes river mountain history science music garden city language people water light"
)
_DE = "der die das und ist nicht ein eine mit auf für von zu den im dem sich"
_FR = "le la les et est pas un une avec sur pour de du dans qui que"
WORDS, GERMAN, FRENCH = _EN.split(), _DE.split(), _FR.split()

STEPS, LOG_EVERY, SEQ_LEN, MICRO, ACCUM = 200, 10, 128, 4, 2
GLOBAL_TOKENS = SEQ_LEN * MICRO * ACCUM
CONFIG_OVERRIDES = [
    "run.name=factory",
    "train.sources=[]",  # one token folder (<run>/tokens), not the demo's mixture
    "model.preset=debug",
    f"train.seq_len={SEQ_LEN}",
    f"train.micro_batch={MICRO}",
    f"train.grad_accum={ACCUM}",
    f"train.steps={STEPS}",
    f"train.log_every={LOG_EVERY}",
    "train.eval_every=100",
    "train.optim.warmup_steps=10",
    "train.optim.lr=3e-3",
    "train.optim.min_lr=3e-4",
    "checkpoint.every=100",
    "tokenizer.vocab_size=512",
    "tokenizer.heldout_docs=20",
]


def _documents(n: int = 240, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        lang, words, score = ("en", WORDS, rng.uniform(0.8, 0.99))
        if i % 10 == 3:
            lang, words, score = "de", GERMAN, rng.uniform(0.7, 0.95)
        elif i % 10 == 7:
            lang, words, score = "fr", FRENCH, rng.uniform(0.7, 0.95)
        length = int(rng.lognormvariate(4.0, 0.7)) + 5
        sentences = []
        while sum(len(s.split()) for s in sentences) < length:
            sentences.append(
                " ".join(rng.choice(words) for _ in range(rng.randint(5, 14))).capitalize() + "."
            )
        docs.append(
            {
                "id": f"doc-{i:05d}",
                "text": " ".join(sentences),
                "url": f"https://example.org/{lang}/{i}",
                "language": lang,
                "language_score": round(score, 4),
            }
        )
    return docs


def _data(root: Path, docs: list[dict]) -> Path:
    out = root / "data"
    (out / "docs").mkdir(parents=True)
    shard = out / "docs" / "part-00000.parquet"
    pq.write_table(pa.Table.from_pylist(docs), shard)
    kept_bytes = sum(len(d["text"].encode()) for d in docs)
    funnel = [  # docs_in, docs_out, bytes scale, dropped reasons
        ("read", 1000, 1000, 40.0, {}),
        ("protocol", 1000, 820, 36.0, {"protocol:status": 120, "protocol:content_type": 60}),
        ("extract", 820, 760, 4.0, {"extract:empty": 60}),
        ("langid", 760, 520, 3.0, {"lang:score<0.65": 90, "lang:not_kept": 150}),
        ("quality", 520, 300, 2.0, {"gopher:short_doc": 110, "c4:javascript": 40, "fineweb:line_punct": 70}),
        ("dedup", 300, len(docs), 1.2, {"dedup:exact": 25, "dedup:minhash": 300 - len(docs) - 25}),
    ]
    steps = [
        {
            "name": name,
            "docs_in": a,
            "docs_out": b,
            "bytes_in": int(kept_bytes * s * a / b),
            "bytes_out": int(kept_bytes * s),
            "seconds": round(0.1 + a / 900, 3),
            "dropped": dropped,
        }
        for name, a, b, s, dropped in funnel
    ]
    files = {
        f"crawl-{i}.warc.gz": {
            "records": 500,
            "bytes": steps[0]["bytes_in"] // 2,
            "by_type": {"response": 500},
        }
        for i in range(2)
    }
    stats = {
        "version": 1,
        "fingerprint": "d" * 64,
        "steps": steps,
        "errors": [],
        "inputs": {"files": files, "unknown": [], "records": 1000, "bytes": steps[0]["bytes_in"]},
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    return shard


def _lr(step: int) -> float:
    warmup, peak, floor = 10, 3e-3, 3e-4
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / (STEPS - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def _metrics(root: Path, cfg_fp: str, manifest: dict, seed: int = 3) -> None:
    rng = random.Random(seed)
    recs: list[dict] = [
        {
            "type": "start",
            "time": 1_760_000_000.0,
            "config_fingerprint": cfg_fp,
            "tokenizer_fingerprint": manifest["tokenizer_fingerprint"],
            "data_fingerprint": manifest["data_fingerprint"],
            "global_batch": {
                "micro": MICRO,
                "accum": ACCUM,
                "world": 1,
                "seq_len": SEQ_LEN,
                "sequences": MICRO * ACCUM,
                "tokens": GLOBAL_TOKENS,
                "configured_tokens": None,
            },
            "model": {
                "params": 123_456,
                "non_embedding_params": 90_000,
                "flops_per_token": 800_000,
                "max_seq_len": 256,
            },
            "device": "cpu",
            "peak_flops": 1.0e11,
            "peak_source": "measured fp32 matmul",
            "schedule": [[s, _lr(s)] for s in range(0, STEPS + 1, 20)],
        }
    ]
    for step in range(LOG_EVERY, STEPS + 1, LOG_EVERY):
        loss = 3.2 + 6.0 * math.exp(-step / 60) + rng.gauss(0, 0.03)
        tps = 2000 * rng.uniform(0.97, 1.03)
        step_ms = GLOBAL_TOKENS / tps * 1000
        recs.append(
            {
                "type": "train",
                "step": step,
                "tokens_seen": step * GLOBAL_TOKENS,
                "tokens_in_step": GLOBAL_TOKENS,
                "loss": loss,
                "loss_token": loss + 0.02,
                "loss_eos": loss + 1.1,
                "loss_bos": loss + 0.6,
                "lr": _lr(step),
                "grad_norm": 0.4 + 1.2 * math.exp(-step / 50) + abs(rng.gauss(0, 0.02)),
                "clipped": step < 30,
                "tokens_per_s": tps,
                "mfu": tps * 800_000 / 1.0e11,
                "step_ms": step_ms,
                "data_ms": 0.03 * step_ms,
                "data_wait_frac": 0.03,
                "rss_mb": 900 + rng.uniform(-5, 5),
                "cuda_alloc_mb": None,
                "cuda_reserved_mb": None,
                "cuda_peak_mb": None,
                "comm_ms": 0.0,
                # a one-source run: the mixture "main" (oreline.tokens.mixture)
                "source_tokens": {"main": step * GLOBAL_TOKENS},
                "source_tokens_interval": {"main": LOG_EVERY * GLOBAL_TOKENS},
                "source_sequences": {"main": step * MICRO * ACCUM},
                "source_epochs": {"main": round(step * GLOBAL_TOKENS / 1_000_000, 4)},
                "source_weights": {"main": 1.0},
            }
        )
        if step % 100 == 0:
            recs.append(
                {
                    "type": "eval",
                    "step": step,
                    "val_loss": loss + 0.08,
                    "val_ppl": math.exp(loss + 0.08),
                    "val_bpb": (loss + 0.08) / math.log(2) / 4.1,
                    "val_loss_token": loss + 0.1,
                    "val_loss_eos": loss + 1.3,
                    "val_loss_bos": loss + 0.7,
                    "train_loss": loss,
                }
            )
            # downstream tasks in the loop (train.eval_tasks): accuracy rising above chance
            acc = {"arc_easy": 0.25 + step / 4000, "copa": 0.5 + step / 2000}
            chance = {"arc_easy": 0.25, "copa": 0.5}
            centered = {n: (acc[n] - chance[n]) / (1 - chance[n]) for n in acc}
            recs.append(
                {
                    "type": "tasks",
                    "step": step,
                    "tokens_seen": step * GLOBAL_TOKENS,
                    "acc": acc,
                    "acc_norm": acc,
                    "centered": centered,
                    "chance": chance,
                    "items": {"arc_easy": 500, "copa": 100},
                    "core": sum(centered.values()) / 2,
                    "seconds": 1.5,
                }
            )
            recs.append(
                {
                    "type": "generation",
                    "step": step,
                    "prompt": "The model",
                    "text": " reads data from <many> sources & learns",
                    "mode": "greedy",
                }
            )
            recs.append(
                {
                    "type": "checkpoint",
                    "step": step,
                    "path": f"checkpoints/step-{step:08d}",
                    "kind": "full",
                    "seconds": 0.4,
                    "bytes": 2_000_000,
                }
            )
        if step == 150:
            recs.append(
                {
                    "type": "event",
                    "step": step,
                    "kind": "loss_spike",
                    "values": {"loss": 7.9, "z": 6.4},
                    "action": "skip",
                    "message": "loss 7.9 is 6.4σ above the window mean; batch skipped",
                }
            )
    recs.append(
        {
            "type": "end",
            "step": STEPS,
            "tokens_seen": STEPS * GLOBAL_TOKENS,
            "seconds": 130.2,
            "final_val_loss": recs[-2]["val_loss"] if recs[-2]["type"] == "eval" else None,
        }
    )
    with open(root / "metrics.jsonl", "w") as fh:
        for rec in recs:
            fh.write(json.dumps(rec) + "\n")


def _checkpoints(root: Path, cfg, cfg_fp: str, manifest: dict) -> None:
    """Real checkpoints of a real (debug-size) Llama through oreline.train.checkpoint."""
    import torch

    from oreline.config import to_dict
    from oreline.model.llama import Llama
    from oreline.model.presets import resolve_model_args
    from oreline.train.checkpoint.save import save_checkpoint

    torch.manual_seed(0)
    args = resolve_model_args(cfg.model, vocab_size=manifest["vocab_size"])
    model = Llama(args)
    optim = torch.optim.AdamW(model.parameters(), lr=_lr(0))
    for step in (100, 200):
        meta = {
            "tokens_seen": step * GLOBAL_TOKENS,
            "config": to_dict(cfg),
            "config_fingerprint": cfg_fp,
            "tokenizer_fingerprint": manifest["tokenizer_fingerprint"],
            "data_fingerprint": manifest["data_fingerprint"],
            "model_args": args.to_dict(),
            "tokenizer_dir": str(root / "tokenizer"),
        }
        save_checkpoint(root / "checkpoints", step, model, optim, meta, cfg=cfg.checkpoint)


def build_healthy_run(root: Path) -> Path:
    """Write a complete healthy run directory at root and return it."""
    from oreline.config import load_config, write_resolved
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    cfg = load_config(None, CONFIG_OVERRIDES)
    cfg_fp = write_resolved(cfg, root, section="run")
    shard = _data(root, _documents())
    train_tokenizer([shard], root / "tokenizer", cfg.tokenizer)
    manifest = tokenize_corpus(
        [shard],
        root / "tokenizer",
        root / "tokens",
        cfg.tokenize.model_copy(update={"val_fraction": 0.1}),
        workers=1,
    )
    _metrics(root, cfg_fp, manifest)
    _checkpoints(root, cfg, cfg_fp, manifest)
    from oreline.export.hf import export_hf

    export_hf(root, root / "export")  # the real export of the latest checkpoint (export_format check)
    (root / "eval").mkdir()
    (root / "eval" / "eval-00000200.json").write_text(
        json.dumps(
            {
                "step": 200,
                "val_loss": 3.5,
                "val_ppl": math.exp(3.5),
                "val_bpb": 1.2,
                "generations": [
                    {
                        "prompt": "Once upon a time",
                        "text": " the river <b>ran</b> to the city",
                        "mode": "sample",
                    }
                ],
            }
        )
    )
    (root / "lineage.json").write_text(
        json.dumps(
            {
                stage: {
                    "key": f"{i:x}" * 16,
                    "finished": True,
                    "output": f"{i + 10:x}" * 16,
                    "seconds": 1.0 + i,
                }
                for i, stage in enumerate(["data", "tokenizer", "tokenize", "train"])
            },
            indent=2,
        )
    )
    return root


_TEMPLATE: list[Path] = []


def session_template(tmp_path_factory) -> Path:
    """One healthy run per test session, shared by tests/doctor and tests/report (built in ~5 s)."""
    if not _TEMPLATE:
        _TEMPLATE.append(build_healthy_run(tmp_path_factory.mktemp("healthy-template") / "run"))
    return _TEMPLATE[0]


def copy_run(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest


def rewrite_metrics(run: Path, edit) -> None:
    """Apply edit(record) -> record | None to every metrics.jsonl line (None drops it)."""
    path = run / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in (edit(rec) for rec in records) if r is not None]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
