"""Tokenizer training: fixed specials, no unknowns, HF compatibility, fingerprint, stats."""

from __future__ import annotations

import json
import re

import pytest

from oreline.config import TokenizerConfig
from oreline.tokens.train_bpe import canonical_fingerprint, load_tokenizer, train_tokenizer

PROBES = [
    "Plain ASCII text, with punctuation!",
    "Unicode: naïve café, Straße, ½ ∑",
    "中文：彰化县劳工运动会暨园游会于12月1日上午在县立体育场盛大登场。",
    "Русский: Привет, как дела? Ёжик в тумане.",
    "Emoji 😀🎉👩‍👩‍👧 end",
    "runs   of    spaces\t\ttabs\n\n\nnewlines  ",
    " leading space",
    "literal <s> and </s> and <pad> and <unk> as text",
    "<s>",
    "",
]


@pytest.fixture(params=["byte_tokenizer_dir", "metaspace_tokenizer_dir"])
def tok_dir(request):
    return request.getfixturevalue(request.param)


def test_special_tokens_have_fixed_ids_and_vocab_is_padded(tok_dir):
    tok = load_tokenizer(tok_dir)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert [tok.hf.id_to_token(i) for i in range(3)] == ["<pad>", "<s>", "</s>"]
    assert tok.vocab_size % 64 == 0 and tok.vocab_size >= tok.trained_vocab_size > tok.vocab_size - 64
    stats = json.loads((tok_dir / "tokenizer_stats.json").read_text())
    assert stats["padded_vocab_size"] == tok.vocab_size
    assert stats["fingerprint"] == tok.fingerprint


def test_metaspace_has_unk_at_3_and_byte_fallback(metaspace_tokenizer_dir, byte_tokenizer_dir):
    meta = load_tokenizer(metaspace_tokenizer_dir)
    assert meta.unk_id == 3
    assert meta.hf.token_to_id("<0x41>") is not None
    assert load_tokenizer(byte_tokenizer_dir).unk_id is None


def test_no_unknown_tokens_on_chinese_and_russian(tok_dir, corpus):
    tok = load_tokenizer(tok_dir)
    texts = [t for _, t in corpus["zh"] + corpus["ru"]] + ["𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 never seen in training"]
    ids = tok.encode_batch(texts)
    assert tok.unk_id is None or all(tok.unk_id not in seq for seq in ids)
    assert [tok.decode(seq) for seq in ids] == texts
    stats = json.loads((tok_dir / "tokenizer_stats.json").read_text())
    assert stats["heldout"]["docs"] > 20
    assert stats["heldout"]["unk_tokens"] == 0 and stats["heldout"]["unk_rate"] == 0.0


def test_encode_has_no_specials_and_literal_special_text_is_text(tok_dir):
    tok = load_tokenizer(tok_dir)
    for text in PROBES:
        ids = tok.encode(text)
        assert not {tok.bos_id, tok.eos_id, tok.pad_id} & set(ids), text
        assert tok.decode(ids) == text
    assert len(tok.encode("<s>")) > 1  # spelled out, never the control token


def test_transformers_autotokenizer_gives_identical_ids(tok_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    tok = load_tokenizer(tok_dir)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 0)
    for text in PROBES:
        assert hf.encode(text) == tok.encode(text), text
        assert hf(text)["input_ids"] == tok.encode(text), text  # no BOS/EOS added by HF either
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is False and config["add_eos_token"] is False
    assert json.loads((tok_dir / "tokenizer.json").read_text())["post_processor"] is None
    assert (tok_dir / "special_tokens_map.json").is_file()


def test_stats_report_fertility_roundtrip_and_merges(tok_dir):
    stats = json.loads((tok_dir / "tokenizer_stats.json").read_text())
    h = stats["heldout"]
    assert h["roundtrip_rate"] == 1.0 and h["roundtrip_exact"] == h["docs"]
    assert 1.0 < h["tokens_per_word"] < 4.0
    assert 0.1 < h["tokens_per_byte"] < 0.7
    assert len(stats["top_merges"]) == 20 and all(" + " in m for m in stats["top_merges"])
    assert stats["train_docs"] > 500


def test_fingerprint_is_canonical(byte_tokenizer_dir, tmp_path):
    text = (byte_tokenizer_dir / "tokenizer.json").read_text()
    obj = json.loads(text)
    assert canonical_fingerprint(json.dumps(obj, indent=4)) == canonical_fingerprint(text)
    obj["model"]["merges"] = obj["model"]["merges"][:-1]
    assert canonical_fingerprint(json.dumps(obj)) != canonical_fingerprint(text)


def test_continuing_subword_prefix_round_trips(corpus_files, tmp_path):
    stats = train_tokenizer(
        corpus_files[:1],
        tmp_path,
        TokenizerConfig(vocab_size=512, continuing_subword_prefix="##", heldout_docs=50),
    )
    tok = load_tokenizer(tmp_path)
    assert any(t.startswith("##") for t in tok.hf.get_vocab())
    text = "Wherefore art thou Romeo? Deny thy father and refuse thy name."
    assert tok.decode(tok.encode(text)) == text
    assert stats["heldout"]["roundtrip_rate"] > 0.95


def test_cli_tokenizer_train(corpus_files, tmp_path):
    from typer.testing import CliRunner

    from oreline.cli import app

    result = CliRunner().invoke(
        app,
        [
            "tokenizer",
            "train",
            str(corpus_files[2]),
            str(corpus_files[0]),
            "--out",
            str(tmp_path),
            "--vocab-size",
            "300",
            "tokenizer.heldout_docs=10",
        ],
    )
    assert result.exit_code == 0, result.output
    stats = json.loads((tmp_path / "tokenizer_stats.json").read_text())
    assert stats["target_vocab_size"] == 300 and stats["padded_vocab_size"] == 320
    assert "round trip exact" in result.output


def test_round_trip_any_text(byte_tokenizer_dir, metaspace_tokenizer_dir):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    byte_tok, meta_tok = load_tokenizer(byte_tokenizer_dir), load_tokenizer(metaspace_tokenizer_dir)
    chars = st.characters(
        blacklist_categories=("Cs",), blacklist_characters="▁"
    )  # ▁ is metaspace's own symbol
    texts = st.text(alphabet=chars, max_size=80) | st.sampled_from(PROBES)

    @settings(max_examples=150, deadline=None, database=None)
    @given(texts)
    def check(text):
        for tok in (byte_tok, meta_tok):
            ids = tok.encode(text)
            assert tok.decode(ids) == text
            assert tok.unk_id is None or tok.unk_id not in ids
            assert not {0, 1, 2} & set(ids)

    check()


def test_runs_longer_than_the_cap_reach_the_trainer_in_pieces():
    """A pre-token never exceeds MAX_RUN_CHARS: a long run of letters or of spaces is cut, the
    pieces add up to the text, and ordinary text passes as it is."""
    from oreline.tokens.train_bpe import MAX_RUN_CHARS, _bounded_runs

    text = "emma " + "x" * (3 * MAX_RUN_CHARS + 7) + " woodhouse" + " " * (MAX_RUN_CHARS + 1) + "end"
    counters: dict = {}
    pieces = list(_bounded_runs(text, counters))
    assert "".join(pieces) == text and counters == {"long_runs_cut": 2}
    too_long = re.compile(rf"\S{{{MAX_RUN_CHARS + 1}}}|\s{{{MAX_RUN_CHARS + 1}}}")
    assert not any(too_long.search(p) for p in pieces)
    plain = "Emma Woodhouse, handsome, clever, and rich " * 100
    assert list(_bounded_runs(plain, counters)) == [plain] and counters == {"long_runs_cut": 2}


def test_a_corpus_too_small_for_the_vocabulary_warns_and_records_why(corpus_files, tmp_path):
    """--vocab-size 32000 on ~450 KB: training runs out of merges long before; the run says so,
    with both sizes and the reason, and tokenizer_stats.json records it (issue 36)."""
    from typer.testing import CliRunner

    from oreline.cli import app

    out = tmp_path / "tok"
    result = CliRunner().invoke(
        app, ["tokenizer", "train", str(corpus_files[0]), "--out", str(out), "--vocab-size", "32000"]
    )
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "tokenizer_stats.json").read_text())
    trained = stats["trained_vocab_size"]
    assert trained < 32000
    assert stats["vocab_shortfall"] == {
        "requested": 32000,
        "trained": trained,
        "reason": "no_more_merges",
        "message": stats["warnings"][0],
    }
    said = " ".join(result.output.split())
    assert "warning:" in said and f"{trained:,} tokens, not the 32,000 asked" in said
    assert "tokenizer.min_frequency" in said
    # the fingerprint is still that of tokenizer.json alone
    assert stats["fingerprint"] == canonical_fingerprint((out / "tokenizer.json").read_text())
    # a vocabulary the corpus fills has no warning
    full = train_tokenizer(corpus_files[:1], tmp_path / "full", TokenizerConfig(vocab_size=512))
    assert full["trained_vocab_size"] == 512 and full["vocab_shortfall"] is None and full["warnings"] == []
