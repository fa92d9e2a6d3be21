"""The training format's inference form: a tokenizer that encodes `[BOS] text`, and the check that says what is off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from oreline.tokens.format import (
    PROBE_TEXTS,
    check_inference_tokenizer,
    inference_tokenizer_config,
    inference_tokenizer_json,
    prompt_ids,
    training_tokenizer_json,
)
from oreline.tokens.train_bpe import canonical_fingerprint, load_tokenizer


def inference_folder(training_dir: Path, out: Path, template: str | None = None) -> Path:
    """The export's tokenizer files (as export/hf.py writes them), optionally with another template."""
    out.mkdir()
    text = inference_tokenizer_json((training_dir / "tokenizer.json").read_text(encoding="utf-8"), 1)
    if template is not None:
        obj = json.loads(text)
        tok = Tokenizer.from_str(text)
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[("<s>", 1), ("</s>", 2)]
        )
        obj["post_processor"] = json.loads(tok.to_str())["post_processor"]
        text = json.dumps(obj)
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    cfg = json.loads((training_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(inference_tokenizer_config(cfg, 64)), encoding="utf-8"
    )
    return out


@pytest.mark.parametrize("kind", ["byte_tokenizer_dir", "metaspace_tokenizer_dir"])
def test_inference_form_encodes_bos_then_the_training_ids(kind, request, tmp_path):
    training = request.getfixturevalue(kind)
    tok = load_tokenizer(training)
    folder = inference_folder(training, tmp_path / "inf")
    bare = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bare.encode_special_tokens = True
    for text in (*PROBE_TEXTS, "Grüße aus Köln", "</s></s>"):
        assert bare.encode(text).ids == prompt_ids(tok, text) == [1] + tok.encode(text)
    assert check_inference_tokenizer(folder, 1, 2, 64) == []
    # and back: the training tokenizer's fingerprint, so shards and checkpoints still match
    back = training_tokenizer_json((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert canonical_fingerprint(back) == tok.fingerprint


@pytest.mark.parametrize(
    ("template", "finding"),
    [
        ("<s> <s> $A", "adds BOS twice"),
        ("<s> $A </s>", "appends EOS"),
        ("$A", "adds no BOS"),
    ],
)
def test_check_names_what_the_tokenizer_does_wrong(template, finding, byte_tokenizer_dir, tmp_path):
    folder = inference_folder(byte_tokenizer_dir, tmp_path / "inf", template)
    problems = check_inference_tokenizer(folder, 1, 2, 64)
    assert len(problems) == 1 and finding in problems[0]


def test_check_reads_the_client_settings(byte_tokenizer_dir, tmp_path):
    folder = inference_folder(byte_tokenizer_dir, tmp_path / "inf")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg |= {"add_bos_token": False, "add_eos_token": True, "model_max_length": 1_000_000_000}
    del cfg["model_input_names"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    problems = " | ".join(check_inference_tokenizer(folder, 1, 2, 64))
    for what in (
        "add_bos_token=False",
        "add_eos_token=true",
        "token_type_ids",
        "model_max_length=1000000000",
    ):
        assert what in problems
    shutil.rmtree(folder)
    assert "unreadable" in check_inference_tokenizer(folder, 1, 2)[0]
