"""`oreline eval CHECKPOINT`: validation loss, perplexity, bits per byte and generations of a checkpoint.

What the figures mean and how they are computed is in `oreline.model.scoring` (shared with the
training loop's evaluation steps).

`oreline eval CHECKPOINT` loads a model through `oreline.train.checkpoint.load.load_model_state`,
uses the run's tokenizer and validation shards (or `--data`), and writes all of the above as JSON
to `<run>/eval/eval-step-N.json` (or `--out`). A model-only snapshot with no run behind it (an
`oreline import-hf` folder) is evaluated with the default config on `--data`, at the model's
max_seq_len or `--seq-len`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from oreline.errors import CheckpointError, InputError
from oreline.model.scoring import generate_samples, token_byte_lengths, validation_loss

# ---------------------------------------------------------------------------------------------
# oreline eval


def _read_prompts(path: Path | None, default: list[str]) -> list[str]:
    if path is None:
        return list(default)
    if not Path(path).is_file():
        raise InputError(f"prompt file {path} not found", "pass a text file with one prompt per line")
    prompts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise InputError(f"prompt file {path} holds no prompts", "write one prompt per line")
    return prompts


def _run_dir_of(ckpt: Path) -> Path:
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def _tokenizer_dir(ckpt: Path, meta: dict, given: Path | None) -> Path:
    """--tokenizer, else meta.json's tokenizer_dir, else the snapshot's own tokenizer/ (an import's
    copy, found wherever the import was moved), else the run's tokenizer/."""
    if given is not None:
        return Path(given)
    for cand in (meta.get("tokenizer_dir"), ckpt / "tokenizer", _run_dir_of(ckpt) / "tokenizer"):
        if cand and (Path(cand) / "tokenizer.json").is_file():
            return Path(cand)
    raise InputError(
        f"no tokenizer found for {ckpt} (meta.json tokenizer_dir={meta.get('tokenizer_dir')!r})",
        "pass --tokenizer DIR, the tokenizer folder the model was trained with",
    )


def evaluate_cli(
    checkpoint: Path,
    data: Path | None = None,
    prompts: Path | None = None,
    out: Path | None = None,
    batches: int | None = None,
    console: Any = None,
    seq_len: int | None = None,
    tokenizer_dir: Path | None = None,
) -> dict[str, Any]:
    """`oreline eval`: validation metrics and generations of one checkpoint, written as JSON.

    A checkpoint of a training run takes its config, tokenizer and tokens from the run; a model-only
    snapshot with no run behind it (what `oreline import-hf` writes) takes the default config, its
    own tokenizer/ folder (or `tokenizer_dir`), `--data` and the model's max_seq_len (or `seq_len`).
    """
    from oreline.config import Config, config_from_dict
    from oreline.model.kernels.matmul import available_backends
    from oreline.model.kernels.select import kernels_for, resolve_attention
    from oreline.model.llama import Llama, ModelArgs, check_shapes
    from oreline.model.presets import check_model_memory
    from oreline.tokens.format import convention
    from oreline.tokens.loader import TokenLoader
    from oreline.tokens.train_bpe import load_tokenizer
    from oreline.train.checkpoint.load import load_model_state, resolve_checkpoint

    ckpt = resolve_checkpoint(Path(checkpoint))
    state_dict, args, meta = load_model_state(ckpt)
    if isinstance(args, dict):
        args = ModelArgs.from_dict(args)
    if "config" in meta:
        cfg = config_from_dict(meta["config"], source=f"{ckpt}/meta.json")
    else:  # a model-only snapshot with no run behind it (oreline import-hf, a hand-made one): defaults
        if data is None:
            raise InputError(
                f"{ckpt} is a model-only snapshot with no training run (no config in its meta.json), "
                "so there are no run tokens to evaluate on",
                f"pass --data TOKENS (a token folder made with its tokenizer): oreline eval {ckpt} --data TOKENS",
            )
        cfg = Config()
    # the sequence length: --seq-len, else the run's train.seq_len, else the model's context
    seq_len = seq_len or (cfg.train.seq_len if "config" in meta else args.max_seq_len)
    if not 0 < seq_len <= args.max_seq_len:
        raise InputError(
            f"--seq-len {seq_len} is outside 1..{args.max_seq_len}, the model's max_seq_len",
            f"pass --seq-len {min(args.max_seq_len, 256)} or less",
        )
    tok_dir = _tokenizer_dir(ckpt, meta, tokenizer_dir)
    tokenizer = load_tokenizer(tok_dir)
    if meta.get("tokenizer_fingerprint") and meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise CheckpointError(
            f"{ckpt} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}…, "
            f"{tok_dir} holds {tokenizer.fingerprint[:12]}…",
            "restore the tokenizer folder the run was trained with",
        )
    tokens_dir = (
        Path(data) if data is not None else Path(meta.get("tokens_dir") or (_run_dir_of(ckpt) / "tokens"))
    )
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    # the kernels the run trained with (oreline.model.kernels.select), so eval computes as training did
    recorded = meta.get("cpu_matmul") if meta.get("cpu_matmul") in available_backends() else "blas"
    # meta.json's model_args are the file's word: the weights read must have their shapes, and the
    # model they describe (a forged max_seq_len's RoPE tables) must fit, before anything is built
    check_shapes(state_dict, args, source=str(ckpt))
    check_model_memory(args, device, f"{ckpt}/meta.json")
    attention = resolve_attention(cfg.train.attention, device, cfg.train.doc_mask)
    model = Llama(args, kernels_for(cfg.train.kernels, device, recorded, attention))
    model.load_state_dict(state_dict, strict=True)
    model.to(device)

    n_batches = batches if batches is not None else cfg.eval.batches
    # A one-off command over the val split (a small fraction of a corpus): it checks every byte it
    # may read (sha256, document index, ids, BOS/EOS), as `oreline tokens verify` does, since a
    # score computed on a tampered or damaged folder would be reported as real.
    val = TokenLoader(
        tokens_dir,
        split="val",
        seq_len=seq_len,
        micro_batch=cfg.train.micro_batch,
        seed=cfg.train.seed,
        tokenizer_fingerprint=tokenizer.fingerprint,
        doc_mask=cfg.train.doc_mask,
        verify="full",
    )
    val.check_fits(args.vocab_size, tokenizer.bos_id, tokenizer.eos_id, f"the model of {ckpt}")
    # The first n_batches × micro_batch sequences, the last batch partial where the split ends:
    # the set training validates on (TokenLoader.iter_eval_set), so the demo's eval.batches = 50 and
    # train.eval_sequences = 400 both score its whole split and report the same loss.
    sequences = n_batches * cfg.train.micro_batch
    metrics = validation_loss(
        model,
        val.iter_eval_set(sequences),
        tokenizer.bos_id,
        tokenizer.eos_id,
        None,
        token_byte_lengths(tokenizer),
    )
    prompt_list = _read_prompts(prompts, cfg.eval.prompts)
    gens = generate_samples(model, tokenizer, prompt_list, cfg.eval.max_new_tokens, greedy=True)
    gens += generate_samples(
        model,
        tokenizer,
        prompt_list,
        cfg.eval.max_new_tokens,
        greedy=False,
        temperature=cfg.eval.temperature,
        top_k=cfg.eval.top_k,
        seed=cfg.train.seed,
    )
    step = int(meta.get("step", 0))
    result = {
        "checkpoint": str(ckpt),
        "step": step,
        "tokens_seen": meta.get("tokens_seen"),
        "tokens_dir": str(tokens_dir),
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "data_fingerprint": getattr(val, "data_fingerprint", None),
        "val_loss": metrics["loss"],
        "val_ppl": metrics["ppl"],
        "val_bpb": metrics["bpb"],
        "val_loss_token": metrics["loss_token"],
        "val_loss_eos": metrics["loss_eos"],
        "val_loss_bos": metrics["loss_bos"],
        "val_targets": metrics["targets"],
        "val_bytes": metrics["bytes"],
        "val_batches": metrics["batches"],
        "val_sequences": val.eval_set_size(sequences),
        "generations": gens,
        "training_format": convention(tokenizer.bos_id, tokenizer.eos_id),
    }
    out_path = Path(out) if out is not None else _run_dir_of(ckpt) / "eval" / f"eval-step-{step}.json"
    from oreline.io import write_json_atomic

    write_json_atomic(out_path, result)
    if console is not None:
        _print_result(result, out_path, console)
    return result


def _print_result(r: dict[str, Any], path: Path, console: Any) -> None:
    from rich.markup import escape

    from oreline.tokens.format import describe

    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    console.print(
        f"[bold]eval[/] {escape(r['checkpoint'])} (step {r['step']}): val loss {f(r['val_loss'], '.4f')} | "
        f"ppl {f(r['val_ppl'], ',.2f')} | bpb {f(r['val_bpb'], '.4f')} | token {f(r['val_loss_token'], '.3f')} "
        f"eos {f(r['val_loss_eos'], '.3f')} after-BOS {f(r['val_loss_bos'], '.3f')} "
        f"over {r['val_targets']:,} targets of {r['val_sequences']:,} sequences in {r['val_batches']} batches",
        highlight=False,
    )
    if r.get("training_format"):
        console.print(f"  format: {escape(describe(r['training_format']))}", highlight=False)
    for g in r["generations"]:
        console.print(
            f"  [dim]{g['mode']}[/] {escape(repr(g['prompt']))} → {escape(repr(g['text']))}", highlight=False
        )
    console.print(f"written to {escape(str(path))}")


def load_eval(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))
