"""oreline's downstream scores against lm-eval 0.4's on the very same items, item for item.

    .venv/bin/python benchmarks/downstream_vs_lmeval.py [--model EXPORT] [--tasks core] [--max-items 200]

Without --model it trains a small demo-like Llama (benchmarks/clients.py: a byte-level BPE of 2048
on tinyshakespeare, 3 layers of 128, trained on `[BOS] text [EOS]` at seq_len 128 of max_seq_len
256, trained at 256) in a temporary folder and exports it with `oreline export` (export_hf): the
trained context is the export's max_position_embeddings, and contexts longer than it are
truncated from the left by both sides. Then:
  - oreline: oreline.eval.downstream on the export (load_scoring_model: the HF folder itself);
  - lm-eval: `lm_eval.simple_evaluate(model="hf", model_args="pretrained=EXPORT,softmax_dtype=float64")`
    and one local task YAML per task (dataset_path: json over the items oreline scored, written to
    the temporary folder), log_samples=True for the per-item log-likelihoods; then once more with
    lm-eval's default (fp32 log_softmax and sum).
It prints, per task, acc and acc_norm from both and the largest per-item |Δ log-likelihood|
(nats) over every choice of every item, against lm-eval in float64 (the reference: both sides start
from the same fp32 logits; oreline sums its fp32 token log-probabilities exactly) and, beside it,
against lm-eval's fp32 default (whose float32 sum rounds at every add: one ulp of a -2,000-nat
total is 1.2e-4). It exits 1 unless the accuracies equal lm-eval float64's and every Δ to it is
within 1e-4. Offline: the YAMLs read local files and HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-4
SEQ_LEN = 256


def _clients():
    spec = importlib.util.spec_from_file_location("oreline_bench_clients", ROOT / "benchmarks" / "clients.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_model(work: Path, steps: int) -> Path:
    """A small trained model exported as a Hugging Face folder (the path)."""
    from oreline.config import TokenizerConfig
    from oreline.export.hf import export_hf
    from oreline.tokens.train_bpe import load_tokenizer, train_tokenizer
    from oreline.train.checkpoint.save import save_checkpoint

    clients = _clients()
    prose, _ = clients.corpus(clients.samples_dir())
    (work / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(prose)), encoding="utf-8"
    )
    train_tokenizer(
        [work / "docs.jsonl"], work / "tokenizer", TokenizerConfig(vocab_size=2048, heldout_docs=0)
    )
    tok = load_tokenizer(work / "tokenizer")
    args = clients.tiny_args(tok.vocab_size, dim=128, n_layers=3)
    # trained at the full 256 context: lm-eval refuses continuations longer than the context (PIQA's
    # longest solutions are ~200 tokens of this small vocabulary)
    model, loss = clients.train_demo_like(prose, tok, args, steps=steps, batch=8, seq_len=SEQ_LEN)
    print(f"trained {steps} steps: loss {loss:.3f}", flush=True)
    meta = {
        "model_args": args.to_dict(),
        "tokenizer_dir": str(work / "tokenizer"),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": SEQ_LEN}},
        "tokenizer_fingerprint": tok.fingerprint,
    }
    save_checkpoint(work / "run" / "checkpoints", steps, model, None, meta, kind="model_only")
    export_hf(work / "run", work / "export")
    return work / "export"


def oreline_scores(export: Path, tasks_spec: str, max_items: int | None) -> dict:
    """{task: {"metrics", "lls": [[ll per choice] per item], "items": [raw JSON objects]}}."""
    from oreline.eval.downstream import load_scoring_model
    from oreline.model.downstream import encode_pair, score_task
    from oreline.model.tasks import resolve_tasks

    loaded = load_scoring_model(export)
    out = {}
    for task in resolve_tasks(tasks_spec):
        # lm-eval asserts that every continuation fits the context (oreline scores its last L
        # tokens): items with a longer one are left out of the comparison, and counted
        kept = [
            it
            for it in (task.items[:max_items] if max_items else task.items)
            if all(
                len(encode_pair(loaded["tokenizer"], c, x)[1]) <= loaded["context_len"] for c, x in it.pairs
            )
        ]
        left_out = (min(max_items, len(task.items)) if max_items else len(task.items)) - len(kept)
        task.items = kept
        t0 = time.perf_counter()
        r = score_task(loaded["model"], loaded["tokenizer"], task, loaded["context_len"], max_items=max_items)
        rows = sorted(r["per_item"], key=lambda x: x["index"])
        items = task.items[:max_items] if max_items else task.items
        out[task.name] = {
            "kind": task.kind,
            "metrics": {k: r[k] for k in ("items", "acc", "acc_norm")},
            "lls": [row["loglikelihoods"] for row in rows],
            "greedy": [row["greedy"] for row in rows],
            "items": items,
            "left_out": left_out,
            "seconds": time.perf_counter() - t0,
        }
    return out


def _yaml(name: str, kind: str, data: Path, partial: bool) -> str:
    head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files: {{test: {data}}}\ntest_split: test\n"
    if kind == "cloze":
        return head + (
            "output_type: loglikelihood\ndoc_to_text: context\ndoc_to_target: continuation\n"
            "metric_list:\n  - metric: acc\n"
        )
    fields = (
        "doc_to_text: gold\ndoc_to_choice: contexts\ndoc_to_target: continuation\n"
        if partial
        else "doc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: gold\n"
    )
    return head + (
        f'output_type: multiple_choice\n{fields}target_delimiter: " "\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )


def lm_eval_scores(export: Path, ours: dict, work: Path, softmax_dtype: str | None = None) -> dict:
    """The same items as lm-eval tasks over local JSONL: {task: {"metrics", "lls"}}.

    softmax_dtype None is lm-eval's default (log_softmax and the sum in the model's fp32);
    "float64" computes both in float64 from the same fp32 logits."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    yaml_dir = work / "lm_eval_tasks"
    yaml_dir.mkdir(exist_ok=True)
    names = {}
    for task, o in ours.items():
        rows = []
        for it in o["items"]:
            if o["kind"] == "cloze":
                rows.append({"context": it.pairs[0][0], "continuation": it.pairs[0][1]})
            elif len({c for c, _ in it.pairs}) > 1:  # partial scoring: one context per choice
                rows.append(
                    {
                        "contexts": [c for c, _ in it.pairs],
                        "continuation": it.pairs[0][1][1:],
                        "gold": it.gold,
                    }
                )
            else:
                rows.append(
                    {"context": it.pairs[0][0], "choices": [x[1:] for _, x in it.pairs], "gold": it.gold}
                )
        data = work / f"{task}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        partial = o["kind"] != "cloze" and "contexts" in rows[0]
        names[task] = f"oreline_{task}"
        (yaml_dir / f"{names[task]}.yaml").write_text(
            _yaml(names[task], o["kind"], data, partial), encoding="utf-8"
        )
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={export}" + (f",softmax_dtype={softmax_dtype}" if softmax_dtype else ""),
        tasks=list(names.values()),
        task_manager=TaskManager(include_path=str(yaml_dir)),
        log_samples=True,
        batch_size=16,
        device="cpu",
    )
    out = {}
    for task, lname in names.items():
        samples = sorted(res["samples"][lname], key=lambda s: s["doc_id"])
        lls = [[float(r[0][0]) for r in s["resps"]] for s in samples]
        greedy = [[bool(r[0][1]) for r in s["resps"]] for s in samples]
        m = res["results"][lname]
        out[task] = {
            "metrics": {"acc": m.get("acc,none"), "acc_norm": m.get("acc_norm,none")},
            "lls": lls,
            "greedy": greedy,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="an exported HF folder (default: train a small one)")
    ap.add_argument("--tasks", default="core")
    ap.add_argument("--max-items", type=int, default=100, help="items per task (0: all)")
    ap.add_argument("--steps", type=int, default=150, help="training steps of the small model")
    ap.add_argument("--work", type=Path, help="keep the work folder here (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        export = a.model or build_model(work, a.steps)
        ours = oreline_scores(export, a.tasks, a.max_items or None)
        theirs = lm_eval_scores(export, ours, work, softmax_dtype="float64")
        default = lm_eval_scores(export, ours, work)
    ok = True
    print(
        f"\n{'task':<14}{'items':>6}  {'acc oreline':>11} {'acc lm-eval':>11}  {'norm oreline':>12} "
        f"{'norm lm-eval':>12}  {'max |Δ ll|':>10}  {'greedy equal':>12}  {'fp32 default: acc equal, max |Δ ll|':>36}"
        "  left out (continuation > context)"
    )
    for task, o in ours.items():
        t, d = theirs[task], default[task]
        dmax = _max_delta(o["lls"], t["lls"])
        greedy_eq = sum(ga == gb for ga, gb in zip(o["greedy"], t["greedy"], strict=True))
        ok &= _metrics_equal(o, t) and dmax <= TOL and greedy_eq == len(o["lls"])
        tn = "—" if t["metrics"]["acc_norm"] is None else f"{t['metrics']['acc_norm']:.4f}"
        fp32 = f"{'yes' if _metrics_equal(o, d) else 'NO'}, {_max_delta(o['lls'], d['lls']):.2e}"
        print(
            f"{task:<14}{o['metrics']['items']:>6}  {o['metrics']['acc']:>11.4f} {t['metrics']['acc']:>11.4f}  "
            f"{o['metrics']['acc_norm']:>12.4f} {tn:>12}  {dmax:>10.2e}  {greedy_eq:>6}/{len(o['lls'])}  "
            f"{fp32:>36}  {o['left_out']}"
        )
    print(
        "agreement with lm-eval (softmax_dtype=float64):",
        "equal accuracies, every |Δ ll| ≤ 1e-4" if ok else "DIFFERS",
    )
    return 0 if ok else 1


def _max_delta(ours: list[list[float]], theirs: list[list[float]]) -> float:
    pairs = zip(ours, theirs, strict=True)
    return max(abs(x - y) for la, lb in pairs for x, y in zip(la, lb, strict=True))


def _metrics_equal(o: dict, t: dict) -> bool:
    norm_eq = t["metrics"]["acc_norm"] is None or o["metrics"]["acc_norm"] == t["metrics"]["acc_norm"]
    return o["metrics"]["acc"] == t["metrics"]["acc"] and norm_eq


if __name__ == "__main__":
    sys.exit(main())
