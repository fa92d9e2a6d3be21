"""oreline doctor run: a healthy manufactured run has no findings; each broken thing is named.

Every test starts from a copy of the healthy run (real tokenizer, real token shards, real
checkpoints; manufactured metrics) and breaks exactly one thing the way it breaks in practice.
"""

from __future__ import annotations

import json
import math
from importlib import import_module

from rich.console import Console
from typer.testing import CliRunner

from oreline.doctor.run import diagnose_run, doctor_run_cli, run_checks

run_factory = import_module("oreline_test_run_factory")  # registered by tests/doctor/conftest.py


def ids(run) -> set[str]:
    return {f.check for f in diagnose_run(run)}


def finding(run, check_id):
    return next(f for f in diagnose_run(run) if f.check == check_id)


def edit_train(run, fn):
    def edit(rec):
        if rec["type"] == "train":
            fn(rec)
        return rec

    run_factory.rewrite_metrics(run, edit)


def test_healthy_run_has_no_findings_and_checks_everything(healthy_run):
    assert diagnose_run(healthy_run) == []
    skipped = [f for f in run_checks(healthy_run) if f.status == "skip"]
    assert skipped == [], skipped
    assert doctor_run_cli(healthy_run, Console(record=True)) == 0


def test_nan_loss_is_named_with_steps(healthy_run):
    edit_train(healthy_run, lambda r: r.update(loss=float("nan")) if r["step"] >= 180 else None)
    f = finding(healthy_run, "nan_loss")
    assert f.status == "fail" and "180" in f.evidence and "last finite loss" in f.evidence
    assert ids(healthy_run) == {"nan_loss"}


def test_nan_loss_recovered_is_a_warning(healthy_run):
    edit_train(healthy_run, lambda r: r.update(loss=None) if r["step"] == 120 else None)
    f = finding(healthy_run, "nan_loss")
    assert f.status == "warn" and "120" in f.evidence and "recovered" in f.evidence


def test_lr_constant(healthy_run):
    edit_train(healthy_run, lambda r: r.update(lr=3e-3))
    f = finding(healthy_run, "lr_constant")
    assert "0.003" in f.evidence and "cosine" in f.evidence
    assert ids(healthy_run) == {"lr_constant"}


def test_lr_constant_is_fine_when_the_schedule_is_constant(healthy_run):
    edit_train(healthy_run, lambda r: r.update(lr=3e-3))
    cfg = healthy_run / "config.toml"
    cfg.write_text(cfg.read_text().replace('schedule = "cosine"', 'schedule = "constant"'))
    assert "lr_constant" not in ids(healthy_run)


def test_loss_not_falling(healthy_run):
    edit_train(healthy_run, lambda r: r.update(loss=9.0 + 0.01 * math.sin(r["step"])))
    f = finding(healthy_run, "loss_not_falling")
    assert "9" in f.evidence and f.status == "fail"
    assert ids(healthy_run) == {"loss_not_falling"}


def test_eos_missing_from_shards(healthy_run):
    """Re-write one shard the way a tokenizer with the wrong EOS id would (BOS id used as EOS)."""
    from oreline.tokens import shards
    from oreline.tokens.train_bpe import load_tokenizer

    manifest = json.loads((healthy_run / "tokens" / "manifest.json").read_text())
    tok = load_tokenizer(healthy_run / "tokenizer")
    name = manifest["shards"][0]["name"]
    old = shards.open_shard(healthy_run / "tokens" / name)
    docs = [old.document(i)[1:-1].tolist() for i in range(old.header.documents)]
    del old
    writer = shards.ShardWriter(
        healthy_run / "tokens" / name, tok.fingerprint, tok.vocab_size, tok.bos_id, tok.bos_id
    )
    writer.add_documents(docs)
    writer.close()
    f = finding(healthy_run, "eos_missing")
    assert f"{len(docs):,} of" in f.evidence and name in f.evidence and "id 2" in f.evidence
    assert ids(healthy_run) == {"eos_missing"}


def test_fingerprint_mismatch_after_retraining_the_tokenizer(healthy_run):
    from oreline.config import TokenizerConfig
    from oreline.tokens.train_bpe import train_tokenizer

    train_tokenizer(
        [healthy_run / "data" / "docs"],
        healthy_run / "tokenizer",
        TokenizerConfig(vocab_size=384, heldout_docs=10),
    )
    f = finding(healthy_run, "fingerprint_mismatch")
    assert "tokens/manifest.json" in f.evidence and "shard" in f.evidence and "checkpoint" in f.evidence
    assert "re-run oreline tokenize" in f.fix


def test_fingerprint_mismatch_after_rebuilding_the_shards(healthy_run):
    from oreline.config import TokenizeConfig
    from oreline.tokens.tokenize import tokenize_corpus

    tokenize_corpus(
        [healthy_run / "data" / "docs"],
        healthy_run / "tokenizer",
        healthy_run / "tokens",
        TokenizeConfig(val_fraction=0.3),
        workers=1,
    )
    f = finding(healthy_run, "fingerprint_mismatch")
    assert (
        "tokens/manifest.json data fingerprint" in f.evidence
        and "rebuilt after training started" in f.evidence
    )


def test_seq_len_exceeds_model_maximum(healthy_run):
    cfg = healthy_run / "config.toml"
    cfg.write_text(cfg.read_text().replace("seq_len = 128", "seq_len = 512"))
    f = finding(healthy_run, "seq_len_exceeds_max")
    assert "512" in f.evidence and "256" in f.evidence


def test_seq_len_maximum_from_the_preset_when_training_never_started(healthy_run):
    """The run crashed before writing its start record or a checkpoint: the preset gives the maximum."""
    import shutil

    run_factory.rewrite_metrics(healthy_run, lambda r: None)
    shutil.rmtree(healthy_run / "checkpoints")
    cfg = healthy_run / "config.toml"
    cfg.write_text(cfg.read_text().replace("seq_len = 128", "seq_len = 300"))
    assert "preset" in finding(healthy_run, "seq_len_exceeds_max").evidence


def test_data_wait_high(healthy_run):
    edit_train(healthy_run, lambda r: r.update(data_wait_frac=0.6))
    f = finding(healthy_run, "data_wait_high")
    assert f.status == "fail" and "60%" in f.evidence
    assert ids(healthy_run) == {"data_wait_high"}


def test_throughput_falling(healthy_run):
    edit_train(
        healthy_run, lambda r: r.update(tokens_per_s=2000 - 6 * r["step"], rss_mb=900 + 10 * r["step"])
    )
    f = finding(healthy_run, "throughput_falling")
    assert "RSS grew" in f.evidence
    assert ids(healthy_run) == {"throughput_falling"}


def test_global_batch_configured_differently(healthy_run):
    def edit(rec):
        if rec["type"] == "start":
            rec["global_batch"]["configured_tokens"] = 2048
        return rec

    run_factory.rewrite_metrics(healthy_run, edit)
    f = finding(healthy_run, "global_batch_mismatch")
    assert "1,024" in f.evidence and "2,048" in f.evidence


def test_global_batch_short_steps(healthy_run):
    edit_train(healthy_run, lambda r: r.update(tokens_in_step=512) if r["step"] in (60, 70) else None)
    f = finding(healthy_run, "global_batch_mismatch")
    assert "2 steps" in f.evidence and "60, 70" in f.evidence


def test_repeated_grad_spikes(healthy_run):
    edit_train(
        healthy_run,
        lambda r: r.update(grad_norm=r["grad_norm"] * 12) if r["step"] in (120, 150, 180) else None,
    )
    f = finding(healthy_run, "grad_spikes")
    assert "3 grad norms" in f.evidence and "step 150" in f.evidence
    assert ids(healthy_run) == {"grad_spikes"}


def test_single_grad_spike_is_not_repeated(healthy_run):
    edit_train(healthy_run, lambda r: r.update(grad_norm=r["grad_norm"] * 12) if r["step"] == 150 else None)
    assert "grad_spikes" not in ids(healthy_run)


def test_checkpoint_that_does_not_load(healthy_run):
    shard = healthy_run / "checkpoints" / "step-00000200" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])  # a save cut short by a full disk
    f = finding(healthy_run, "checkpoint_unloadable")
    assert "step-00000200" in f.evidence and "step-00000100" in f.fix
    assert "step-00000100:" not in f.evidence


def test_latest_pointing_nowhere(healthy_run):
    (healthy_run / "checkpoints" / "latest").write_text("step-00000300\n")  # retention deleted it
    f = finding(healthy_run, "checkpoint_unloadable")
    assert "latest points to" in f.evidence and "step-00000200" in f.fix


def test_checkpoint_meta_unreadable(healthy_run):
    (healthy_run / "checkpoints" / "step-00000100" / "meta.json").write_text("{not json")
    assert "step-00000100" in finding(healthy_run, "checkpoint_unloadable").evidence


def test_val_far_above_train(healthy_run):
    def edit(rec):
        if rec["type"] == "eval":
            rec["val_loss"] = rec["train_loss"] + 2.0
        return rec

    run_factory.rewrite_metrics(healthy_run, edit)
    f = finding(healthy_run, "val_far_above_train")
    assert "step 200" in f.evidence and "epochs" in f.evidence
    assert ids(healthy_run) == {"val_far_above_train"}


def test_torn_metrics_line_and_data_errors_are_reported(healthy_run):
    with open(healthy_run / "metrics.jsonl", "a") as fh:
        fh.write('{"type": "train", "step": 21')
    stats_path = healthy_run / "data" / "stats.json"
    stats = json.loads(stats_path.read_text())
    stats["errors"] = [
        {"file": "crawl-00001.warc.gz", "offset": 48213, "error": "gzip: unexpected end of stream"}
    ]
    stats_path.write_text(json.dumps(stats))
    assert ids(healthy_run) == {"metrics_unreadable", "data_errors"}
    assert "48213" in finding(healthy_run, "data_errors").evidence


def test_empty_run_directory_skips_every_check(tmp_path):
    findings = run_checks(tmp_path)
    assert findings and all(f.status == "skip" for f in findings)
    assert all(f.evidence.startswith("not checked:") for f in findings)


def test_cli_names_the_signature_and_exits_1(healthy_run):
    from oreline.cli import app

    edit_train(healthy_run, lambda r: r.update(data_wait_frac=0.7))
    result = CliRunner().invoke(app, ["doctor", "run", str(healthy_run)], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "data_wait_high" in result.output


def test_garbage_records_never_crash_a_check(healthy_run):
    """Records with wrong types in every field: checks skip or report, none raises."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    junk = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 10**6),
        st.floats(allow_nan=True),
        st.text(max_size=5),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )
    keys = [
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "data_wait_frac",
        "data_ms",
        "step_ms",
        "tokens_in_step",
        "val_loss",
        "train_loss",
        "kind",
        "global_batch",
        "model",
        "schedule",
        "rss_mb",
        "tokens_seen",
    ]
    record = st.fixed_dictionaries(
        {"type": st.sampled_from(["start", "train", "eval", "event", "end", "generation"])},
        optional={k: junk for k in keys},
    )

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(record, max_size=30))
    def check(records):
        (healthy_run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        crashed = [f for f in run_checks(healthy_run) if "check raised" in f.evidence]
        assert crashed == []

    check()


def test_export_whose_tokenizer_disagrees_with_the_training_format(healthy_run):
    import shutil

    export = healthy_run / "export"
    assert json.loads((export / "config.json").read_text())["max_position_embeddings"] == run_factory.SEQ_LEN
    # an export made the old way: the training tokenizer copied as is (no BOS added, context 1e9)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(healthy_run / "tokenizer" / name, export / name)
    f = finding(healthy_run, "export_format")
    assert f.status == "fail" and "adds no BOS" in f.evidence and "model_max_length=1000000000" in f.evidence
    assert "<s> text </s>" in f.evidence and "re-export" in f.fix


def test_gguf_export_checked_against_the_training_format(healthy_run):
    import pytest

    pytest.importorskip("gguf")
    from oreline.export.gguf import export_gguf, export_state_dict_gguf
    from oreline.train.checkpoint.load import load_model_state

    export_gguf(healthy_run, healthy_run / "export" / "model.gguf")
    assert diagnose_run(healthy_run) == []
    sd, args, _ = load_model_state(healthy_run / "checkpoints" / "step-00000200")
    export_state_dict_gguf(
        sd,
        args,
        healthy_run / "tokenizer",
        healthy_run / "export" / "model.gguf",
        context_len=run_factory.SEQ_LEN // 2,
    )
    assert "context_length=" in finding(healthy_run, "export_format").evidence
