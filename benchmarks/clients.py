"""Every client of an oreline export feeds the model as it was trained, and gets oreline's numbers.

    .venv/bin/python benchmarks/clients.py [--steps 300] [--work DIR]

Builds a demo-like model (a byte-level BPE trained on English prose and multilingual sentences, a
small Llama trained on `[BOS] text [EOS]` documents at seq_len 128 of max_seq_len 256), exports it
as a Hugging Face folder and as GGUF (f32, f16, q8_0), then asks each client for
  - tokenization of multilingual text (prompts and held-out documents, one with a literal "<s>"),
  - greedy continuations of the prompts with its default settings,
  - the log-likelihood of held-out documents (rolling perplexity: `[BOS] text`, text tokens scored;
    documents chosen to fit the trained context, so one window covers each),
  - the log-likelihood of continuations given contexts (lm-eval's loglikelihood requests),
and compares them with oreline's own (oreline.eval.evaluate.generate_samples and the oreline
model's log-probabilities of the same `[BOS] + ids`). One table: the largest difference over all
items and the tolerance it is held to.

Clients and where they run:
  transformers (this venv, 5.x)          generate(**tok(p)) defaults; forward of tok(text) defaults
  pipeline("text-generation")            do_sample=False (the pipeline samples by default)
  transformers 4.57                      benchmarks/.hf4-venv (transformers 4.57 over this venv)
  llama.cpp f32 / f16 / q8_0             llama-cpp-python in benchmarks/.clients-venv
  lm-eval rolling / loglikelihood        lm-evaluation-harness 0.4.13 in benchmarks/.clients-venv,
                                         `hf` model with default model_args, local json tasks
A client whose venv or package is missing is reported as "not run" with the reason.

lm-eval 0.4.13 cannot be right for both request types with one setting when the tokenizer adds BOS
(oreline.tokens.format): loglikelihood requests take the tokenizer's BOS (defaults are right), the
rolling log-likelihood adds its own BOS prefix on top (defaults give `[BOS][BOS] text`, BOS scored);
with add_bos_token=False the rolling one is right and the contexts lose their BOS. Both runs are in
the table; the expected differences are marked "expected", not "ok".

Set up the side venvs (they see this venv's packages through a .pth file, so torch is shared):
    python3.11 -m venv benchmarks/.clients-venv
    echo "$PWD/.venv/lib/python3.11/site-packages" > benchmarks/.clients-venv/lib/python3.11/site-packages/shared.pth
    benchmarks/.clients-venv/bin/pip install lm-eval==0.4.13 llama-cpp-python==0.3.36   # ~15 min compile
    (the same with benchmarks/.hf4-venv and "transformers==4.57.*")
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENTS_PY = ROOT / "benchmarks" / ".clients-venv" / "bin" / "python"
HF4_PY = ROOT / "benchmarks" / ".hf4-venv" / "bin" / "python"
MAX_NEW = 24
SEQ_LEN = 128

PROMPTS = [
    "First Citizen:",
    "ROMEO:\nO, she doth teach the torches",
    "Der Himmel über der Stadt",
    "Le matin, les enfants",
    "El viejo pescador",
    "Москва — столица",
    "a literal <s> in a prompt",
]


# ---------------------------------------------------------------------------------------------
# client side: plain functions of (export, inputs) → results, importable without oreline


def client_transformers(export: str, inputs: dict) -> dict:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(export)
    model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    out: dict = {
        "version": transformers.__version__,
        "tokens": [tok(t)["input_ids"] for t in inputs["texts"]],
    }
    gens = []
    for p in inputs["prompts"]:
        enc = tok(p, return_tensors="pt")  # default: the tokenizer's own BOS handling
        gens.append(model.generate(**enc, max_new_tokens=MAX_NEW)[0, enc["input_ids"].shape[1] :].tolist())
    out["greedy"] = gens
    out["doc_logprob"] = []
    with torch.no_grad():
        for text in inputs["docs"]:
            ids = tok(text, return_tensors="pt")["input_ids"]
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
            out["doc_logprob"].append(float(logp.gather(1, ids[0, 1:, None]).sum()))
    if hasattr(transformers, "pipeline"):
        pipe = transformers.pipeline("text-generation", model=model, tokenizer=tok)
        out["pipeline"] = [
            pipe(p, max_new_tokens=MAX_NEW, do_sample=False, return_full_text=False)[0]["generated_text"]
            for p in inputs["prompts"]
        ]
    return out


def client_llama_cpp(gguf_path: str, inputs: dict) -> dict:
    import numpy as np
    from llama_cpp import Llama

    # use_extra_bufts=False: on AMX CPUs llama.cpp's repacked q8_0 buffers crash the decode
    kw = {"use_extra_bufts": False} if "use_extra_bufts" in Llama.__init__.__code__.co_varnames else {}
    llm = Llama(model_path=gguf_path, n_ctx=256, logits_all=True, verbose=False, n_threads=2, seed=0, **kw)
    out: dict = {
        "tokens": [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in inputs["texts"]]
    }
    gens = []
    for p in inputs["prompts"]:
        ids = llm.tokenize(p.encode("utf-8"), add_bos=True, special=False)
        new = []
        llm.reset()
        for tok_id in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
            new.append(tok_id)
            if tok_id == llm.token_eos() or len(new) >= MAX_NEW:
                break
        gens.append(new)
    out["greedy"] = gens
    out["doc_logprob"] = []
    for text in inputs["docs"]:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        out["doc_logprob"].append(float(logp[np.arange(len(ids) - 1), ids[1:]].sum()))
    return out


def client_lm_eval(export: str, inputs: dict, work: str, model_args: str = "") -> dict:
    """lm-eval's `hf` model (default settings unless model_args) on two local json tasks."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    work_dir = Path(work)
    (work_dir / "docs.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in inputs["docs"]), encoding="utf-8"
    )
    (work_dir / "pairs.jsonl").write_text(
        "".join(json.dumps({"context": c, "continuation": x}) + "\n" for c, x in inputs["pairs"]),
        encoding="utf-8",
    )
    tasks = work_dir / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "oreline_rolling.yaml").write_text(
        f"""task: oreline_rolling
dataset_path: json
dataset_kwargs:
  data_files: {{test: {work_dir / "docs.jsonl"}}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
""",
        encoding="utf-8",
    )
    (tasks / "oreline_pairs.yaml").write_text(
        f"""task: oreline_pairs
dataset_path: json
dataset_kwargs:
  data_files: {{test: {work_dir / "pairs.jsonl"}}}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
  - metric: acc
""",
        encoding="utf-8",
    )
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={export}{model_args}",
        tasks=["oreline_rolling", "oreline_pairs"],
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
        batch_size=1,
        device="cpu",
    )
    samples = res["samples"]
    rolling = sorted(samples["oreline_rolling"], key=lambda s: s["doc_id"])
    pairs = sorted(samples["oreline_pairs"], key=lambda s: s["doc_id"])

    def first(resp):
        while isinstance(resp, list | tuple):
            resp = resp[0]
        return float(resp)

    return {
        "version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?",
        "rolling": [first(s["resps"]) for s in rolling],
        "pairs": [first(s["resps"]) for s in pairs],
    }


# ---------------------------------------------------------------------------------------------
# oreline side


def samples_dir() -> Path:
    from oreline.config import samples_dir as find

    return find()


def corpus(samples: Path) -> tuple[list[str], list[str]]:
    """(training documents, multilingual sentences) from the shared sample data."""
    with gzip.open(samples / "english-prose" / "tinyshakespeare.txt.gz", "rt", encoding="utf-8") as fh:
        prose = [p for p in fh.read().split("\n\n") if p.strip()]
    multi = []
    for lang in ("de", "fr", "es", "ru", "it", "pt", "nl", "pl", "tr", "ja", "zh", "ar", "el"):
        path = samples / "langid" / "lingua-testdata" / "sentences" / f"{lang}.txt.gz"
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                multi += [line.strip() for line in fh if line.strip()][:400]
    return prose, multi


def tiny_args(vocab_size: int, dim: int, n_layers: int):
    """A small Llama of the demo's shape (4 heads, 2 KV heads, ffn 3 x dim, tied embeddings,
    context 256): the model these clients train and tests/export/conftest.py's demo_model."""
    from oreline.model.llama import ModelArgs

    return ModelArgs(
        dim=dim,
        n_layers=n_layers,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=vocab_size,
        ffn_dim=3 * dim,
        max_seq_len=256,
        tie_embeddings=True,
    )


def train_demo_like(docs: list[str], tok, args, *, steps: int, batch: int, seq_len: int, report=None):
    """A small Llama (`args`) trained as oreline trains: `[BOS] text [EOS]` documents in one stream,
    BOS never a target, AdamW at 3e-3, seeded; (the model in eval mode, its last loss).
    tests/export/conftest.py builds its model with it too (loading this file by path)."""
    import torch

    from oreline.model.llama import Llama

    stream = torch.tensor([t for d in docs for t in [tok.bos_id, *tok.encode(d), tok.eos_id]])
    torch.manual_seed(0)
    model = Llama(args)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + seq_len] for s in starts])
        y = torch.stack([stream[s + 1 : s + seq_len + 1] for s in starts])
        y = y.masked_fill(y == tok.bos_id, -100)  # oreline's loader: BOS is never a target
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if report is not None:
            report(step, loss)
    return model.eval(), loss.item()


def build(work: Path, steps: int) -> dict:
    """Tokenizer, model, checkpoint, HF and GGUF exports, and oreline's own numbers."""
    import torch

    from oreline.config import TokenizerConfig
    from oreline.export.gguf import export_gguf
    from oreline.export.hf import export_hf
    from oreline.model.scoring import generate_samples
    from oreline.tokens.train_bpe import load_tokenizer, train_tokenizer
    from oreline.train.checkpoint.save import save_checkpoint

    prose, multi = corpus(samples_dir())
    heldout_prose, train_prose = prose[:40], prose[40:]
    heldout_multi, train_multi = multi[::10], [s for i, s in enumerate(multi) if i % 10]
    docs = train_prose + train_multi
    (work / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)), encoding="utf-8"
    )
    t0 = time.perf_counter()
    train_tokenizer(
        [work / "docs.jsonl"], work / "tokenizer", TokenizerConfig(vocab_size=2048, heldout_docs=0)
    )
    tok = load_tokenizer(work / "tokenizer")
    args = tiny_args(tok.vocab_size, dim=128, n_layers=3)

    def report(step: int, loss) -> None:
        if step % 100 == 0 or step == steps - 1:
            print(f"train step {step}: loss {loss.item():.3f}", flush=True)

    model, loss = train_demo_like(docs, tok, args, steps=steps, batch=16, seq_len=SEQ_LEN, report=report)
    train_s = time.perf_counter() - t0
    meta = {
        "model_args": args.to_dict(),
        "tokenizer_dir": str(work / "tokenizer"),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": SEQ_LEN}},
        "tokenizer_fingerprint": tok.fingerprint,
    }
    save_checkpoint(work / "run" / "checkpoints", steps, model, None, meta, kind="model_only")
    export_hf(work / "run", work / "export")
    for dtype, name in (("float32", "f32"), ("float16", "f16"), ("q8_0", "q8_0")):
        export_gguf(work / "run", work / f"model-{name}.gguf", dtype=dtype)

    # held-out documents that fit the trained context with their BOS (one rolling window each)
    fits = [t for t in heldout_prose + heldout_multi if 8 <= len(tok.encode(t)) < SEQ_LEN]
    heldout = fits[:24]
    pairs = []
    for text in heldout[:16]:
        cut = text.rfind(" ", 0, max(1, len(text) * 2 // 3))
        if cut > 0:
            pairs.append((text[:cut], text[cut:]))
    # tokenization: prompts, held-out prose, every 13th held-out sentence (~3 of each of the 13 languages)
    texts = (
        PROMPTS
        + heldout[:8]
        + heldout_multi[::13]
        + [
            "<s>starts like a BOS and has </s> inside",
            "emoji 🙂 and CJK 東京 and tabs\tend",
            "  two spaces\n\n",
        ]
    )
    ours: dict = {"texts": [[tok.bos_id] + tok.encode(t) for t in texts]}
    ours["greedy"] = [g["ids"] for g in generate_samples(model, tok, PROMPTS, MAX_NEW, greedy=True)]
    ours["greedy_text"] = [tok.decode(ids) for ids in ours["greedy"]]

    @torch.no_grad()
    def logprob(ids: list[int], score_from: int) -> float:
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(x)[0, :-1].double(), -1)
        tgt = torch.tensor(ids[1:])
        return float(logp.gather(1, tgt[:, None])[score_from - 1 :].sum())

    ours["doc_logprob"] = [logprob([tok.bos_id] + tok.encode(t), 1) for t in heldout]
    ours["pairs"] = [logprob([tok.bos_id] + tok.encode(c + x), 1 + len(tok.encode(c))) for c, x in pairs]
    # the pre-fix feed (no BOS), to show what the clients used to get
    ours["unfed_doc_logprob"] = [logprob(tok.encode(t), 1) for t in heldout]
    inputs = {"prompts": PROMPTS, "texts": texts, "docs": heldout, "pairs": pairs}
    (work / "inputs.json").write_text(json.dumps(inputs, ensure_ascii=False), encoding="utf-8")
    return {
        "ours": ours,
        "inputs": inputs,
        "train_s": train_s,
        "loss": loss,
        "vocab": tok.vocab_size,
        "params": model.num_params(),
    }


def run_client(
    python: Path, name: str, target: str, work: Path, timeout: int = 1800, reuse: bool = False
) -> dict:
    """Run one client in its own interpreter; its JSON result or {"error": why} (reuse: an earlier result)."""
    out = work / f"client-{name}.json"
    if reuse and out.is_file():
        return json.loads(out.read_text(encoding="utf-8"))
    if not python.exists():
        return {"error": f"{python.parent.parent.name} not set up (see this script's docstring)"}
    cmd = [
        str(python),
        str(Path(__file__).resolve()),
        "--client",
        name,
        "--target",
        target,
        "--work",
        str(work),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(out.read_text(encoding="utf-8"))


def compare(
    ours: dict,
    got: dict,
    rows: list,
    client: str,
    logprob_tol: float,
    greedy: str = "equal",
    known: dict | None = None,
) -> None:
    """Rows of (client, what, result, tolerance, status); `known`: key → why this client is expected to differ."""
    known = known or {}
    if "error" in got:
        rows.append((client, "—", "not run", got["error"][-90:], ""))
        return
    if "tokens" in got:
        same = sum(a == b for a, b in zip(got["tokens"], ours["texts"], strict=True))
        rows.append(
            (
                client,
                "tokenization ([BOS] + ids)",
                f"{same}/{len(ours['texts'])} identical",
                "identical",
                "ok" if same == len(ours["texts"]) else "FAIL",
            )
        )
    if "greedy" in got:
        same = sum(a == b for a, b in zip(got["greedy"], ours["greedy"], strict=True))
        rows.append(
            (
                client,
                f"greedy continuation ({MAX_NEW} tokens)",
                f"{same}/{len(ours['greedy'])} identical",
                greedy,
                "ok" if same == len(ours["greedy"]) or greedy != "equal" else "FAIL",
            )
        )
    if "pipeline" in got:
        same = sum(a == b for a, b in zip(got["pipeline"], ours["greedy_text"], strict=True))
        rows.append(
            (
                client + " pipeline",
                "greedy text",
                f"{same}/{len(ours['greedy_text'])} identical",
                "equal",
                "ok" if same == len(ours["greedy_text"]) else "FAIL",
            )
        )
    for key, what in (
        ("doc_logprob", "held-out doc log-prob (rolling)"),
        ("rolling", "rolling loglikelihood"),
        ("pairs", "loglikelihood(context, continuation)"),
    ):
        if key in got:
            ref = ours["doc_logprob"] if key == "rolling" else ours[key]
            diff = max(abs(a - b) for a, b in zip(got[key], ref, strict=True))
            if key in known:
                rows.append(
                    (client, f"{what} ×{len(ref)}", f"max |Δ| {diff:.2e} nats", known[key], "expected")
                )
                continue
            rows.append(
                (
                    client,
                    f"{what} ×{len(ref)}",
                    f"max |Δ| {diff:.2e} nats",
                    f"≤ {logprob_tol:g}",
                    "ok" if diff <= logprob_tol else "FAIL",
                )
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-clients")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the model, exports, oreline's numbers and the side clients' results in --work",
    )
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:  # inside a client's interpreter
        inputs = json.loads((a.work / "inputs.json").read_text(encoding="utf-8"))
        fn = {
            "transformers": lambda: client_transformers(a.target, inputs),
            "llama_cpp": lambda: client_llama_cpp(a.target, inputs),
            "lm_eval": lambda: client_lm_eval(a.target, inputs, str(a.work)),
            "lm_eval_nobos": lambda: client_lm_eval(a.target, inputs, str(a.work), ",add_bos_token=False"),
        }[a.client.split(":")[0]]
        (a.work / f"client-{a.client}.json").write_text(json.dumps(fn()), encoding="utf-8")
        return

    import torch

    torch.set_num_threads(1)
    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.reuse and (a.work / "built.json").is_file():
        built = json.loads((a.work / "built.json").read_text(encoding="utf-8"))
    else:
        built = build(a.work, a.steps)
        (a.work / "built.json").write_text(json.dumps(built, ensure_ascii=False), encoding="utf-8")
    ours, export = built["ours"], str(a.work / "export")
    print(
        f"model: {built['params']:,} parameters, vocab {built['vocab']}, {a.steps} steps at seq_len {SEQ_LEN} "
        f"(final train loss {built['loss']:.3f}) in {built['train_s']:.0f} s",
        flush=True,
    )
    unfed = max(abs(x - y) for x, y in zip(ours["doc_logprob"], ours["unfed_doc_logprob"], strict=True))
    print(f"for scale: feeding the held-out docs without BOS moves their log-prob by up to {unfed:.2f} nats")

    results = {"transformers": client_transformers(export, built["inputs"])}
    results["transformers 4.57"] = run_client(HF4_PY, "transformers", export, a.work, reuse=a.reuse)
    for name in ("f32", "f16", "q8_0"):
        results[f"llama.cpp {name}"] = run_client(
            CLIENTS_PY, f"llama_cpp:{name}", str(a.work / f"model-{name}.gguf"), a.work, reuse=a.reuse
        )
    results["lm-eval 0.4.13 (hf, defaults)"] = run_client(
        CLIENTS_PY, "lm_eval", export, a.work, reuse=a.reuse
    )
    results["lm-eval 0.4.13 (add_bos_token=False)"] = run_client(
        CLIENTS_PY, "lm_eval_nobos", export, a.work, reuse=a.reuse
    )

    rows: list = []
    tol = {
        "transformers": 1e-3,
        "transformers 4.57": 1e-3,
        "llama.cpp f32": 2e-2,
        "llama.cpp f16": 0.5,
        "llama.cpp q8_0": 1.0,
        "lm-eval 0.4.13 (hf, defaults)": 1e-3,
        "lm-eval 0.4.13 (add_bos_token=False)": 1e-3,
    }
    for client, got in results.items():
        reduced = client.endswith(("f16", "q8_0"))
        known = {}
        if client == "lm-eval 0.4.13 (hf, defaults)":
            known["rolling"] = "lm-eval prefixes BOS to an encoding that has one"
        if client == "lm-eval 0.4.13 (add_bos_token=False)":
            known["pairs"] = "add_bos_token=False drops BOS from contexts"
        compare(
            ours,
            got,
            rows,
            client + (f" {got.get('version')}" if got.get("version") and client == "transformers" else ""),
            tol[client],
            greedy="reported (reduced precision)" if reduced else "equal",
            known=known,
        )
    widths = [
        max(len(str(r[i])) for r in rows + [("client", "what", "result", "tolerance", "")]) for i in range(5)
    ]
    line = " | ".join(f"{{:{w}}}" for w in widths)
    print()
    print(line.format("client", "what", "result", "tolerance", ""))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line.format(*r))
    print(f"\n({time.perf_counter() - t0:.0f} s; inputs, exports and client outputs in {a.work})")
    (a.work / "table.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    sys.exit(1 if any(r[4] == "FAIL" for r in rows) else 0)


if __name__ == "__main__":
    main()
