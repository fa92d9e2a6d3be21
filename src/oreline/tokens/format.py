"""Where BOS and EOS go: the one convention that training, eval and every exported client share.

Training (tokenize.py, shards.py): every document is `[BOS] text [EOS]`. The model therefore only
ever saw text that starts right after a BOS, and learned to end a document with EOS. The loader
masks BOS targets, so the model never learned to predict BOS; a second BOS in front of a text is
an input it never saw.

Inference, the same convention seen from a prompt: `[BOS] prompt`, EOS not appended (the model
is to produce it), and generation stops at EOS. oreline's eval generates from `prompt_ids`.

Exported tokenizers encode that way by default (`inference_tokenizer_json`): a `TemplateProcessing`
post-processor puts BOS in front and appends nothing. transformers 4.x and 5.x, `tokenizers` alone
and llama.cpp (the GGUF's `add_bos_token`, export/gguf.py) all apply a post-processor / add-BOS flag,
so `tokenizer(text)` gives exactly `prompt_ids(text)`. The literal characters "<s>" inside a text
stay text everywhere oreline encodes (`encode_special_tokens`; `split_special_tokens` for
transformers; llama.cpp's `parse_special=False`): only the BOS the convention puts in front is a
BOS. `tokenizers` alone does not store `encode_special_tokens`, so a user of the bare
tokenizer.json sets it, as `oreline.tokens.train_bpe.load_tokenizer` does.

lm-evaluation-harness 0.4.13 (`hf` model): its loglikelihood requests encode with the tokenizer's
default, so they get `[BOS] context continuation` as trained. Its rolling log-likelihood
(perplexity tasks) prefixes BOS itself AND encodes with the tokenizer's default, so a tokenizer that
adds BOS (this one, Llama's, Gemma's) gets `[BOS] [BOS] text` with BOS scored as the first target;
run perplexity tasks with `model_args=...,add_bos_token=False` (measured in benchmarks/clients.py).

Training tokenizers (train_bpe.py) keep no post-processor: their fingerprint, and so every token
shard and checkpoint that records it, is unchanged; `training_tokenizer_json` removes the
post-processor again when an export is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOS_TOKEN, EOS_TOKEN = "<s>", "</s>"

# Texts the agreement checks encode: plain text, a literal "<s>"/"</s>" that must stay text, text
# that starts with "<s>" (a client must not take it for the BOS it adds), and the empty prompt.
PROBE_TEXTS = ("Hello world", "a literal <s> and </s> stay text", "<s>starts like a BOS", "")


def convention(bos_id: int, eos_id: int) -> dict[str, Any]:
    """The training format, as eval, report, export and doctor state it."""
    return {
        "document": f"{BOS_TOKEN} text {EOS_TOKEN}",
        "prompt": f"{BOS_TOKEN} prompt",
        "bos": {"token": BOS_TOKEN, "id": bos_id, "added": True},
        "eos": {"token": EOS_TOKEN, "id": eos_id, "added": False},
        "literal_special_text": "stays text",
    }


def describe(conv: dict[str, Any]) -> str:
    """One line for people: 'trained on <s> text </s>; prompts are fed as <s> prompt'."""
    return (
        f"trained on {conv['document']} (BOS id {conv['bos']['id']}, EOS id {conv['eos']['id']}); "
        f"prompts are fed as {conv['prompt']}, EOS not appended"
    )


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """`[BOS] + encode(text)`: a prompt in the training format (no EOS: the model is to write it)."""
    return [tokenizer.bos_id] + tokenizer.encode(text)


def post_processor(bos_id: int) -> dict[str, Any]:
    """tokenizers' TemplateProcessing that prepends BOS (pairs: `<s> A <s> B`, as transformers writes it)."""
    from tokenizers import processors

    proc = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return json.loads(proc.__getstate__())


def inference_tokenizer_json(tokenizer_json: str, bos_id: int) -> str:
    """A training tokenizer.json whose default encoding is `[BOS] text` (everything else unchanged)."""
    obj = json.loads(tokenizer_json)
    obj["post_processor"] = post_processor(bos_id)
    return json.dumps(obj, ensure_ascii=False, indent=2)


def training_tokenizer_json(tokenizer_json: str) -> str:
    """The inverse of `inference_tokenizer_json`: no post-processor, so the fingerprint is the training one."""
    obj = json.loads(tokenizer_json)
    obj["post_processor"] = None
    return json.dumps(obj, ensure_ascii=False)


def inference_tokenizer_config(config: dict[str, Any], context_len: int) -> dict[str, Any]:
    """tokenizer_config.json for clients: BOS added, EOS not, the trained context, left padding, no token_type_ids.

    `add_bos_token` is what transformers' Llama-style tokenizers read (5.x drops it when a tokenizer.json
    is present and uses the post-processor); left padding keeps batched greedy generation equal to
    unbatched (right padding puts pads between a prompt and its continuation); transformers 4.x returns
    token_type_ids, which `generate` refuses, unless `model_input_names` leaves them out.
    """
    return {
        **config,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": int(context_len),
        "padding_side": "left",
        "model_input_names": ["input_ids", "attention_mask"],
        "split_special_tokens": True,
    }


def check_inference_tokenizer(
    folder: Path, bos_id: int, eos_id: int, context_len: int | None = None
) -> list[str]:
    """What in an exported tokenizer folder disagrees with the training format ([] when nothing does).

    Encodes PROBE_TEXTS with `tokenizers` alone (post-processor, no special-token matching, as
    transformers' `split_special_tokens` does) and compares with `[BOS] + ids`; reads the flags and
    lengths of tokenizer_config.json.
    """
    from tokenizers import Tokenizer

    folder = Path(folder)
    problems: list[str] = []
    try:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 (any load failure is the finding)
        return [f"tokenizer.json unreadable ({type(exc).__name__}: {exc})"]
    tok.encode_special_tokens = True
    for text in PROBE_TEXTS:
        plain = tok.encode(text, add_special_tokens=False).ids
        got = tok.encode(text).ids
        if got == [bos_id] + plain:
            continue
        if got[:1] != [bos_id]:
            what = "adds no BOS"
        elif got[1:2] == [bos_id] and plain[:1] != [bos_id]:
            what = "adds BOS twice"
        elif got[-1:] == [eos_id] and plain[-1:] != [eos_id]:
            what = "appends EOS"
        else:
            what = "adds other tokens"
        problems.append(
            f"tokenizer.json {what} to {text!r} (ids {got[:6]}…; training fed [{bos_id}] + text, no EOS)"
        )
        break  # one text shows it; the rest would repeat the finding
    cfg_path = folder / "tokenizer_config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    except (OSError, ValueError) as exc:
        return problems + [f"tokenizer_config.json unreadable ({exc})"]
    if cfg.get("add_bos_token") is not True:
        problems.append(
            f"tokenizer_config.json add_bos_token={cfg.get('add_bos_token')!r} (transformers 4.x Llama "
            "tokenizers read it): training put BOS before every text"
        )
    if cfg.get("add_eos_token"):
        problems.append("tokenizer_config.json add_eos_token=true: prompts would end with EOS")
    if "token_type_ids" in (cfg.get("model_input_names") or ["token_type_ids"]):
        problems.append(
            "tokenizer_config.json model_input_names includes token_type_ids (transformers 4.x "
            "returns them and generate(**tokenizer(text)) fails)"
        )
    if context_len is not None and cfg.get("model_max_length") != context_len:
        problems.append(
            f"tokenizer_config.json model_max_length={cfg.get('model_max_length')!r}, the model was "
            f"trained on {context_len}-token sequences (truncation=True would not truncate)"
        )
    return problems
