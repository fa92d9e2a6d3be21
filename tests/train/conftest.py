"""Session fixtures of the training layer: real English prose → a small BPE tokenizer → token shards.

Jane Austen's *Emma* (nltk-gutenberg in the samples) is cut into ~1,500-character blocks of
paragraphs, one document each; a 512-token byte-level BPE (the `debug` preset's vocabulary)
is trained on them and the documents are tokenized with 10 % held out for validation. About
300k tokens, built once per session in a couple of seconds with the token layer's own functions.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from oreline.config import (
    Config,
    TokenizeConfig,
    TokenizerConfig,
    _set_dotted,
    config_from_dict,
    load_config,
    to_dict,
    to_toml,
)


def _blocks(text: str, target: int = 1500) -> list[str]:
    out, cur, size = [], [], 0
    for para in text.replace("\r\n", "\n").split("\n\n"):
        para = " ".join(para.split())
        if not para:
            continue
        cur.append(para)
        size += len(para)
        if size >= target:
            out.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        out.append("\n\n".join(cur))
    return out


@pytest.fixture(scope="session")
def prose_tokens(samples, tmp_path_factory) -> dict[str, Path]:
    """{"tokens": token shard folder, "tokenizer": tokenizer folder, "docs": JSONL} of Emma."""
    from oreline.tokens.tokenize import tokenize_corpus
    from oreline.tokens.train_bpe import train_tokenizer

    root = tmp_path_factory.mktemp("prose")
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        text = zf.read("gutenberg/austen-emma.txt").decode("utf-8", "replace")
    docs = root / "emma.jsonl"
    with docs.open("w", encoding="utf-8") as fh:
        for i, block in enumerate(_blocks(text)):
            fh.write(json.dumps({"id": f"emma-{i}", "text": block}) + "\n")
    train_tokenizer([docs], root / "tokenizer", TokenizerConfig(vocab_size=512, heldout_docs=20))
    tokenize_corpus([docs], root / "tokenizer", root / "tokens", TokenizeConfig(val_fraction=0.1, workers=1))
    return {"tokens": root / "tokens", "tokenizer": root / "tokenizer", "docs": docs}


def make_config(run_root: Path, prose: dict[str, Path], **dotted) -> Config:
    """A small debug-preset training config on the prose fixture; keyword keys use __ for dots."""
    tree = to_dict(load_config())
    base = {
        "run.runs_dir": str(run_root),
        "run.name": "t",
        "model.preset": "debug",
        "train.tokens": str(prose["tokens"]),
        "train.tokenizer": str(prose["tokenizer"]),
        "train.seq_len": 64,
        "train.micro_batch": 4,
        "train.grad_accum": 2,
        "train.steps": 20,
        "train.log_every": 5,
        "train.eval_every": 10,
        "train.eval_sequences": 16,
        "train.optim.warmup_steps": 4,
        "train.optim.lr": 3e-3,
        "train.optim.min_lr": 3e-4,
        "checkpoint.every": 0,
        "eval.max_new_tokens": 8,
        "eval.prompts": ["The capital of France is", "Emma"],
        # The demo config scores the shipped downstream tasks (6 × 500 items) at a run's last step:
        # 5-25 s of every run here (most of an fp8-emulated one), and no test reads them but
        # tests/train/test_eval_tasks.py, which turns them on with its own tasks and counts.
        "train.eval_tasks": [],
    }
    base.update({k.replace("__", "."): v for k, v in dotted.items()})
    for key, value in base.items():
        _set_dotted(tree, key, value)
    return config_from_dict(tree)


def write_config(
    path: Path, run_root: Path, prose: dict[str, Path], settings: Mapping[str, Any] = {}, **dotted
) -> Path:
    """make_config's config as the TOML file that a run in a subprocess reads (oreline train,
    torchrun, an sbatch script); `settings` ("train.steps": 16, ...) then `dotted` (train__steps=16)
    override its values. The file holds the whole resolved config, so what a test did not set is
    the same in every test that writes one."""
    merged = {k.replace(".", "__"): v for k, v in settings.items()} | dotted
    path.write_text(to_toml(make_config(run_root, prose, **merged)), encoding="utf-8")
    return path


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture
def one_thread():
    """torch on one thread for the test: the 2 shared cores make 2-thread timings erratic (spin-waits)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def train_config(tmp_path, prose_tokens):
    """make_config bound to this test's tmp_path (the run is tmp_path / "t") and the prose tokens."""
    return lambda **dotted: make_config(tmp_path, prose_tokens, **dotted)


# Test folders are not packages (--import-mode=importlib): test modules reach the plain helpers
# above (make_config, write_config, read_metrics) as import_module("oreline_test_train_fixtures").
sys.modules.setdefault("oreline_test_train_fixtures", sys.modules[__name__])


@pytest.fixture(scope="session")
def second_source(samples, prose_tokens, tmp_path_factory) -> Path:
    """A second token folder of the prose tokenizer (Macbeth, ~30k tokens): a mixture's small source."""
    from oreline.tokens.tokenize import tokenize_corpus

    root = tmp_path_factory.mktemp("macbeth")
    with zipfile.ZipFile(samples / "english-prose" / "nltk-gutenberg.zip") as zf:
        text = zf.read("gutenberg/shakespeare-macbeth.txt").decode("utf-8", "replace")
    docs = root / "macbeth.jsonl"
    with docs.open("w", encoding="utf-8") as fh:
        for i, block in enumerate(_blocks(text)):
            fh.write(json.dumps({"id": f"macbeth-{i}", "text": block}) + "\n")
    tokenize_corpus(
        [docs], prose_tokens["tokenizer"], root / "tokens", TokenizeConfig(val_fraction=0.1, workers=1)
    )
    return root / "tokens"


def kill_resume_module():
    """tests/train/test_kill_resume_train.py (its run SETTINGS, launch and comparison helpers), loaded
    by path: test folders are not packages."""
    name = "oreline_test_kill_resume_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("test_kill_resume_train.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


class UninterruptedRun:
    """A `python -m oreline train` run of test_kill_resume_train's SETTINGS, started in the background
    by the first test that asks for it; `finished()` waits for it to end (exit 0) and returns its
    run folder. Tests only read that folder."""

    def __init__(self, config: Path, log: Path, run: Path):
        self.log, self.run = log, run
        self.proc: subprocess.Popen = kill_resume_module().launch(config, log)

    def finished(self) -> Path:
        assert self.proc.wait(timeout=300) == 0, self.log.read_text()[-3000:]
        return self.run


@pytest.fixture(scope="session")
def uninterrupted_run(prose_tokens, tmp_path_factory):
    """The one uninterrupted reference run that the kill-and-resume tests (test_kill_resume_train,
    test_shutdown's SIGTERM test) compare bit for bit against: every one of them would start the
    same run from the same config, so it is run once per session, beside the first test's own run
    (started when that test asks for it, waited for when the test compares)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    kr = kill_resume_module()
    ref = UninterruptedRun(
        kr.write_config(root / "ref.toml", root / "ref", prose_tokens), root / "ref.log", root / "ref" / "r"
    )
    try:
        yield ref
    finally:
        if ref.proc.poll() is None:  # the session ended (a failure, Ctrl-C) before anyone waited for it
            ref.proc.kill()
            ref.proc.wait()
