"""BPE tokenizer training from a document stream, with Hugging Face compatible output.

Algorithm: byte-pair encoding (Sennrich et al. 2016, arXiv:1508.07909) as implemented by the
Hugging Face `tokenizers` library. Documents stream from Parquet/JSONL through
`Tokenizer.train_from_iterator`, so memory is bounded by the trainer's word counts, not by the
corpus. Two pre-tokenizations:

- `byte_level` (GPT-2, Radford et al. 2019): text is split with the GPT-2 regex and mapped to
  256 printable byte symbols; the initial alphabet holds all 256, so every input is encodable
  and there is no `<unk>` at all.
- `metaspace` (SentencePiece style, Kudo & Richardson 2018): spaces become `▁` and a `▁` is
  prepended to the text (a normalizer, as Llama-2's HF tokenizer does, so that a leading space
  survives the round trip); characters outside the learned vocabulary fall back to `<0xXX>`
  byte tokens (byte_fallback), so `<unk>` (id 3, required by the model type) is never emitted.

Special tokens have FIXED ids: `<pad>`=0, `<s>`=1, `</s>`=2 (and `<unk>`=3 for metaspace).
They are never matched in input text: `encode_special_tokens=True` on our side and
`split_special_tokens: true` in tokenizer_config.json for transformers, so a document that
contains the literal text "<s>" is encoded as the characters `<`, `s`, `>`. BOS/EOS are added
by the tokenize step explicitly; the tokenizer itself has no post-processor.

The model's embedding size is the vocabulary rounded up to a multiple of 64
(`padded_vocab_size`, recorded in tokenizer_stats.json and returned as `.vocab_size`): the ids
above the trained vocabulary are never produced and only exist for matmul-friendly shapes.

Round trip: byte_level decodes every text to itself. metaspace decodes a literal `▁` (U+2581)
in the text as a space, the ambiguity SentencePiece has too; the held-out round-trip rate in
tokenizer_stats.json shows how often that happens on a corpus.

Fingerprint: sha256 of the canonical tokenizer.json (json.loads → dumps sort_keys, compact), so
formatting differences do not change it but any change to vocab, merges or settings does.

A corpus too small for tokenizer.vocab_size ends training early (no pair left occurs
tokenizer.min_frequency times): the run warns, and tokenizer_stats.json records it under
"vocab_shortfall" (requested, trained, reason) and "warnings". The fingerprint stays that of the
tokenizer.json: the tokens are what they are, whatever size was asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from oreline.config import TokenizerConfig
from oreline.errors import InputError
from oreline.io import write_json_atomic
from oreline.tokens.fast_encode import FastEncoder, fast_encoder
from oreline.tokens.inputs import Rejects, expand_inputs, iter_texts

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]
PAD_MULTIPLE = 64
HELDOUT_EVERY = 20  # one document in 20 (by id hash) is held out until heldout_docs are collected
# Longest run of non-space (or of space) characters the BPE trainer sees as one piece. Every
# pre-token of both pre-tokenizers lies within such a run, and the trainer's time grows faster
# than linearly with one word's length: a random 100 KB "word" took 23 s to train 512 merges, one
# of 1 MB more than 120 s, one of 10 MB more than 300 s (issue 32). Longer runs (base64 blobs, minified
# code, hostile input) are fed in pieces of this many characters, after which they cost what the
# same bytes of ordinary random words cost (measured: 1 MB in 5 s, 10 MB in 19 s). No useful
# token is this long.
MAX_RUN_CHARS = 256
_LONG_RUN = re.compile(rf"(?<!\S)\S{{{MAX_RUN_CHARS + 1},}}|(?<!\s)\s{{{MAX_RUN_CHARS + 1},}}")


def round_up(n: int, multiple: int = PAD_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


def canonical_fingerprint(tokenizer_json: str) -> str:
    """sha256 of the canonical JSON (sorted keys, compact) of a tokenizer.json text."""
    canon = json.dumps(json.loads(tokenizer_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# the tokenizer others use


@contextlib.contextmanager
def rust_panics_as_errors(where: Path) -> Iterator[None]:
    """A panic in tokenizers' Rust code (pyo3's PanicException, a BaseException that `except
    Exception` lets through) as an InputError. A tokenizer.json whose pre-tokenizer regex backtracks
    badly makes Oniguruma give up ("retry-limit-in-match over") on some texts, and tokenizers then
    panics: that text is then one document the tokenize run rejects, not the end of the run."""
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":  # KeyboardInterrupt, SystemExit, ...: as they are
            raise
        raise InputError(
            f"the tokenizer at {where} failed on a text ({str(exc).strip()[:200]})",
            "use a tokenizer trained by `oreline tokenizer train`; a hand-edited pre-tokenizer regex "
            "that backtracks without bound fails on some texts",
        ) from None


@dataclass
class OrelineTokenizer:
    """A trained tokenizer: fixed special ids, padded vocabulary size, fingerprint.

    `encode` never adds specials and encodes literal "<s>" as text; `decode` skips BOS/EOS/pad.
    """

    hf: object  # tokenizers.Tokenizer
    dir: Path
    fingerprint: str
    vocab_size: int  # padded: what the model's embedding must have
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    fast: FastEncoder | None = None  # same ids as hf, ~2x faster (fast_encode.py); None: hf encodes

    @property
    def trained_vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    @property
    def unk_id(self) -> int | None:
        return self.hf.token_to_id(UNK)

    def encode(self, text: str) -> list[int]:
        with rust_panics_as_errors(self.dir):
            if self.fast is not None:
                return self.fast.encode(text)
            return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        with rust_panics_as_errors(self.dir):
            if self.fast is not None:
                return self.fast.encode_batch(texts)
            # encode_batch_fast skips offset tracking, which we never use.
            return [e.ids for e in self.hf.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(path: str | Path) -> OrelineTokenizer:
    """Load a tokenizer folder written by `oreline tokenizer train` (or any tokenizer.json with our specials)."""
    from tokenizers import Tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(
            f"no tokenizer.json at {path}", "train one with `oreline tokenizer train DOCS --out DIR`"
        )
    text = read_tokenizer_json(file)
    try:
        hf = Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception for JSON that is not a tokenizer
        raise InputError(
            f"{file} is JSON but not a Hugging Face tokenizer ({exc})", _rebuild_hint(file)
        ) from None
    hf.encode_special_tokens = True  # not serialized by tokenizers: set on every load
    for name, want in ((PAD, 0), (BOS, 1), (EOS, 2)):
        if hf.token_to_id(name) != want:
            raise InputError(
                f"{file}: {name} has id {hf.token_to_id(name)}, oreline needs {want}",
                "train the tokenizer with `oreline tokenizer train`",
            )
    # The fast encoder checks itself against hf here and is None (with a warning) when they differ.
    with rust_panics_as_errors(file.parent):
        fast = fast_encoder(hf, json.loads(text))
    return OrelineTokenizer(
        hf=hf,
        dir=file.parent,
        fingerprint=canonical_fingerprint(text),
        vocab_size=round_up(hf.get_vocab_size()),
        fast=fast,
    )


def _rebuild_hint(file: Path) -> str:
    return f"rebuild it with `oreline tokenizer train DOCS --out {file.parent}` (or restore the file from the run that made it)"


def read_tokenizer_json(file: Path) -> str:
    """The text of a tokenizer.json, or an InputError saying how it is broken (empty, binary, cut short)."""
    data = file.read_bytes()
    if not data.strip():
        raise InputError(f"{file} is empty ({len(data)} bytes)", _rebuild_hint(file))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{file} is not UTF-8 text (byte {exc.start}: {exc.reason}); it is binary or corrupted",
            _rebuild_hint(file),
        ) from None
    try:
        json.loads(text)
    except RecursionError:
        raise InputError(f"{file} is nested too deeply to be a tokenizer", _rebuild_hint(file)) from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise InputError(
            f"{file} is not valid JSON, cut short or corrupted ({len(data)} bytes; {exc})",
            _rebuild_hint(file),
        ) from None
    return text


# ---------------------------------------------------------------------------------------------
# training


def build_tokenizer(cfg: TokenizerConfig):
    """An untrained tokenizers.Tokenizer and its trainer for the configured pre-tokenization."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    prefix = cfg.continuing_subword_prefix
    subword = {"continuing_subword_prefix": prefix} if prefix else {}  # tokenizers rejects None
    strip_prefix = [decoders.Replace(Regex("^" + re.escape(prefix)), "")] if prefix else []
    if cfg.pre_tokenizer == "byte_level":
        specials = [PAD, BOS, EOS]
        tok = Tokenizer(models.BPE(**subword))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.Sequence(strip_prefix + [decoders.ByteLevel()])
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        limit = {}
    else:
        # Byte tokens go in as "special" so the trainer puts them at ids 4..259; they are
        # demoted to plain vocabulary entries after training (see _demote_byte_tokens).
        specials = [PAD, BOS, EOS, UNK] + BYTE_TOKENS
        tok = Tokenizer(models.BPE(unk_token=UNK, byte_fallback=True, **subword))
        tok.normalizer = normalizers.Prepend("▁")
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
        tok.decoder = decoders.Sequence(
            strip_prefix
            + [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
        alphabet = []
        # Like SentencePiece's character_coverage: only the most frequent characters enter the
        # alphabet (a quarter of the merge budget); rare ones (e.g. most CJK characters in a
        # small vocabulary) are spelled with byte-fallback tokens instead of eating the vocabulary.
        limit = {"limit_alphabet": max(64, (cfg.vocab_size - len(specials)) // 4)}
    if cfg.vocab_size < len(specials) + len(alphabet) + 1:
        raise InputError(
            f"tokenizer.vocab_size={cfg.vocab_size} leaves no room for merges ({len(specials) + len(alphabet)} base tokens)",
            f"set tokenizer.vocab_size above {len(specials) + len(alphabet)}",
        )
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
        **subword,
        **limit,
    )
    return tok, trainer


def _demote_byte_tokens(tokenizer_json: str) -> str:
    """Keep <0xXX> in the BPE vocabulary (byte_fallback looks them up there) but not as added tokens."""
    obj = json.loads(tokenizer_json)
    obj["added_tokens"] = [t for t in obj["added_tokens"] if t["content"] not in set(BYTE_TOKENS)]
    return json.dumps(obj, ensure_ascii=False)


def _is_heldout(doc_id: str) -> bool:
    return (
        int.from_bytes(hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).digest()[:8], "little")
        % HELDOUT_EVERY
        == 0
    )


def _training_stream(
    paths: list[Path], cfg: TokenizerConfig, rejects: Rejects, heldout: list[str], counters: dict
) -> Iterator[str]:
    for doc_id, text in iter_texts(paths, rejects):
        try:
            n_bytes = len(text.encode("utf-8"))
        except UnicodeEncodeError:  # lone surrogates (from JSON escapes): the tokenizer cannot take them
            rejects.add("invalid_unicode", "", -1, {"id": doc_id})
            continue
        if len(heldout) < cfg.heldout_docs and _is_heldout(doc_id):
            heldout.append(text)
            continue
        if cfg.max_train_docs is not None and counters["docs"] >= cfg.max_train_docs:
            return
        counters["docs"] += 1
        counters["bytes"] += n_bytes
        yield from _bounded_runs(text, counters)


def _bounded_runs(text: str, counters: dict) -> Iterator[str]:
    """`text` as the trainer's pieces: itself, or, when it holds runs of more than MAX_RUN_CHARS
    (non-)space characters, the text between them and each run in MAX_RUN_CHARS pieces (counted
    in counters["long_runs_cut"]). The lookbehinds make each run be scanned once, from its start."""
    if len(text) <= MAX_RUN_CHARS or _LONG_RUN.search(text) is None:
        yield text
        return
    last = 0
    for m in _LONG_RUN.finditer(text):
        counters["long_runs_cut"] = counters.get("long_runs_cut", 0) + 1
        if m.start() > last:
            yield text[last : m.start()]
        for k in range(m.start(), m.end(), MAX_RUN_CHARS):
            yield text[k : min(k + MAX_RUN_CHARS, m.end())]
        last = m.end()
    if last < len(text):
        yield text[last:]


def write_hf_files(out: Path, tokenizer_json: str, cfg: TokenizerConfig) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json, loadable by AutoTokenizer."""
    from oreline.io import write_bytes_atomic

    write_bytes_atomic(out / "tokenizer.json", tokenizer_json.encode("utf-8"))
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    if cfg.pre_tokenizer == "metaspace":
        specials["unk_token"] = UNK
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_eos_token": False,
        "split_special_tokens": True,  # literal "<s>" in text is text, as in oreline
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
    }
    write_json_atomic(out / "tokenizer_config.json", config)
    write_json_atomic(out / "special_tokens_map.json", specials)


def measure(tok: OrelineTokenizer, texts: list[str]) -> dict:
    """Fertility, unknown-token rate and round-trip exactness on held-out documents."""
    if not texts:
        return {
            "docs": 0,
            "tokens": 0,
            "words": 0,
            "bytes": 0,
            "tokens_per_word": None,
            "tokens_per_byte": None,
            "bytes_per_token": None,
            "unk_tokens": 0,
            "unk_rate": 0.0,
            "roundtrip_exact": 0,
            "roundtrip_rate": None,
            "roundtrip_failures": [],
        }
    ids = tok.encode_batch(texts)
    n_tokens = sum(map(len, ids))
    n_words = sum(len(t.split()) for t in texts)
    n_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    unk = tok.unk_id
    n_unk = sum(seq.count(unk) for seq in ids) if unk is not None else 0
    failures = []
    exact = 0
    for text, seq in zip(texts, ids, strict=True):
        back = tok.decode(seq)
        if back == text:
            exact += 1
        elif len(failures) < 5:
            at = next(
                (i for i, (a, b) in enumerate(zip(text, back, strict=False)) if a != b),
                min(len(text), len(back)),
            )
            failures.append(
                {
                    "at_char": at,
                    "expected": text[max(0, at - 20) : at + 20],
                    "decoded": back[max(0, at - 20) : at + 20],
                }
            )
    return {
        "docs": len(texts),
        "tokens": n_tokens,
        "words": n_words,
        "bytes": n_bytes,
        "tokens_per_word": n_tokens / max(n_words, 1),
        "tokens_per_byte": n_tokens / max(n_bytes, 1),
        "bytes_per_token": n_bytes / max(n_tokens, 1),
        "unk_tokens": n_unk,
        "unk_rate": n_unk / max(n_tokens, 1),
        "roundtrip_exact": exact,
        "roundtrip_rate": exact / len(texts),
        "roundtrip_failures": failures,
    }


def _readable_merges(tokenizer_json: str, byte_level: bool, n: int = 20) -> list[str]:
    """The first merges learned (= the most frequent pairs), shown as text."""
    merges = json.loads(tokenizer_json)["model"]["merges"][:n]
    if byte_level:
        from tokenizers import decoders

        dec = decoders.ByteLevel()
        return [
            " + ".join(repr(dec.decode([p])) for p in (m if isinstance(m, list) else m.split(" ")))
            for m in merges
        ]
    return [
        " + ".join(repr(p.replace("▁", " ")) for p in (m if isinstance(m, list) else m.split(" ")))
        for m in merges
    ]


TOKENIZER_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "rejects.json",
    "tokenizer_stats.json",
)


def train_tokenizer(
    inputs: list[str | Path],
    out_dir: str | Path,
    cfg: TokenizerConfig,
    force: bool = False,
    allow_incomplete: bool = False,
) -> dict:
    """Train BPE on Parquet/JSONL documents; write HF files and tokenizer_stats.json; return the stats.

    The output folder is claimed as oreline's "tokenizer" folder first (`oreline.outdir`): a
    non-empty folder oreline did not create is refused, or with `force` used when it holds none of
    `TOKENIZER_NAMES`, and locked for this one writer. A data run that has not finished is refused
    unless `allow_incomplete`.
    """
    from oreline.outdir import FolderLock, claim_folder

    out = Path(out_dir)
    paths = expand_inputs(inputs, allow_incomplete)
    claim_folder(
        out,
        "tokenizer",
        "oreline tokenizer train",
        force=force,
        reserved=TOKENIZER_NAMES.__contains__,
        legacy=lambda d: (d / "tokenizer_stats.json").is_file() and (d / "tokenizer.json").is_file(),
    )
    with FolderLock(out, "oreline tokenizer train"):  # one writer: two trainings would mix their files
        return _train(paths, out, cfg)


def _train(paths: list[Path], out: Path, cfg: TokenizerConfig) -> dict:
    tok, trainer = build_tokenizer(cfg)
    rejects = Rejects()
    heldout: list[str] = []
    counters = {"docs": 0, "bytes": 0}
    t0 = time.perf_counter()
    tok.train_from_iterator(_training_stream(paths, cfg, rejects, heldout, counters), trainer)
    train_s = time.perf_counter() - t0
    if counters["docs"] == 0:
        raise InputError(
            f"no usable documents in {', '.join(map(str, paths))} (rejected: {rejects.counts})",
            "check the inputs hold non-empty 'text' fields",
        )
    text = tok.to_str()
    if cfg.pre_tokenizer == "metaspace":
        text = _demote_byte_tokens(text)
    write_hf_files(out, text, cfg)
    if rejects.rows:
        write_json_atomic(out / "rejects.json", {"counts": rejects.counts, "rows": rejects.rows})
    loaded = load_tokenizer(out)
    stats = {
        "fingerprint": loaded.fingerprint,
        "pre_tokenizer": cfg.pre_tokenizer,
        "continuing_subword_prefix": cfg.continuing_subword_prefix,
        "target_vocab_size": cfg.vocab_size,
        "trained_vocab_size": loaded.trained_vocab_size,
        "padded_vocab_size": loaded.vocab_size,
        "special_tokens": {PAD: 0, BOS: 1, EOS: 2, **({UNK: 3} if loaded.unk_id is not None else {})},
        "inputs": [str(p) for p in paths],
        "train_docs": counters["docs"],
        "train_bytes": counters["bytes"],
        "long_runs_cut": counters.get("long_runs_cut", 0),
        "train_seconds": round(train_s, 3),
        "rejected": rejects.counts,
        "heldout": measure(loaded, heldout),
        "top_merges": _readable_merges(text, cfg.pre_tokenizer == "byte_level"),
        "settings": cfg.model_dump(mode="json"),
    }
    short = vocab_shortfall(cfg, loaded.trained_vocab_size, counters)
    stats["vocab_shortfall"] = short
    stats["warnings"] = [short["message"]] if short else []
    write_json_atomic(out / "tokenizer_stats.json", stats)
    return stats


def vocab_shortfall(cfg: TokenizerConfig, trained: int, counters: dict) -> dict | None:
    """Why the trained vocabulary is smaller than tokenizer.vocab_size, or None when it is not.

    The BPE trainer stops early, without a word, when no pair of tokens occurs at least
    tokenizer.min_frequency times any more: a small corpus has only so many merges (3,000 paragraphs
    of tinyshakespeare, 0.45 MB, give 7,809 tokens of 32,000 asked). The model is then built for the smaller, padded size; saying so
    keeps a user from believing the asked size is the one in use."""
    if trained >= cfg.vocab_size:
        return None
    capped = (
        f" (tokenizer.max_train_docs={cfg.max_train_docs} capped the documents)"
        if cfg.max_train_docs is not None and counters["docs"] >= cfg.max_train_docs
        else ""
    )
    message = (
        f"the tokenizer has {trained:,} tokens, not the {cfg.vocab_size:,} asked for (tokenizer.vocab_size): "
        f"the {counters['docs']:,} training documents ({counters['bytes'] / 1e6:,.2f} MB){capped} have no "
        f"more pairs of tokens occurring at least {cfg.min_frequency} times (tokenizer.min_frequency) "
        f"to merge; train on more text for a larger vocabulary, or ask for --vocab-size {trained} to make "
        "the size explicit"
    )
    return {
        "requested": cfg.vocab_size,
        "trained": trained,
        "reason": "no_more_merges",
        "message": message,
    }


def print_tokenizer_stats(stats: dict, console) -> None:
    from rich.table import Table

    h = stats["heldout"]
    table = Table(
        title=f"tokenizer {stats['fingerprint'][:12]} ({stats['pre_tokenizer']})", show_header=False
    )
    rows = [
        (
            "vocabulary (trained / padded)",
            f"{stats['trained_vocab_size']:,} / {stats['padded_vocab_size']:,}"
            + (f" ({stats['target_vocab_size']:,} asked)" if stats.get("vocab_shortfall") else ""),
        ),
        (
            "trained on",
            f"{stats['train_docs']:,} docs, {stats['train_bytes'] / 1e6:.2f} MB in {stats['train_seconds']:.1f} s",
        ),
        ("held-out docs", f"{h['docs']:,}"),
    ]
    if h["docs"]:
        rows += [
            ("tokens per word", f"{h['tokens_per_word']:.3f}"),
            ("tokens per byte", f"{h['tokens_per_byte']:.4f} ({h['bytes_per_token']:.2f} bytes/token)"),
            ("unknown-token rate", f"{h['unk_rate']:.6f} ({h['unk_tokens']} of {h['tokens']:,})"),
            ("round trip exact", f"{h['roundtrip_exact']} / {h['docs']} ({h['roundtrip_rate']:.2%})"),
        ]
    if stats["rejected"]:
        rows.append(("rejected rows", ", ".join(f"{k}={v}" for k, v in sorted(stats["rejected"].items()))))
    rows.append(("first merges", ", ".join(stats["top_merges"][:8])))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    from rich.markup import escape

    for warning in stats.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {escape(warning)}")
