"""Config loading: TOML files, dotted overrides, unknown keys, validation messages, fingerprints."""

from __future__ import annotations

import pytest

from oreline.config import (
    PACKAGE_CONFIGS,
    Config,
    config_from_dict,
    diff_keys,
    expand,
    fingerprint,
    load_config,
    parse_overrides,
    samples_dir,
    to_dict,
    valid_keys,
    write_resolved,
)
from oreline.errors import ConfigError


def test_embedded_demo_config_loads_and_differs_from_defaults():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.run.name == "demo"
    assert "ja" in cfg.data.langid.languages  # set in demo.toml, not a default
    assert Config().data.langid.languages == ["en"]


def test_every_packaged_config_is_valid():
    from oreline.ablation import load_ablation

    files = sorted(PACKAGE_CONFIGS.glob("*.toml"))
    assert files
    for path in files:
        # ablation-*.toml are `oreline ablate` configs (recipes, proxy model), the others `oreline run` configs
        (load_ablation if path.name.startswith("ablation-") else load_config)(path)


def test_shipped_configs_load_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: the name resolves inside the package
    assert load_config("demo").run.name == "demo"
    assert load_config("seed-recipe") == load_config(PACKAGE_CONFIGS / "seed-recipe.toml")
    with pytest.raises(ConfigError, match="demo, seed-recipe"):
        load_config("no-such-preset")
    (tmp_path / "demo").write_text("[run]\nname = 'mine'\n")  # a file of that name wins over the preset
    assert load_config("demo").run.name == "mine"


def test_overrides_are_parsed_as_toml_literals():
    cfg = load_config(
        None,
        [
            "data.langid.threshold=0.8",
            "data.workers=3",
            "data.chunk.enabled=true",
            "data.langid.languages=['en','de']",
            "run.name=my run",
        ],
    )
    assert cfg.data.langid.threshold == 0.8
    assert cfg.data.workers == 3
    assert cfg.data.chunk.enabled is True
    assert cfg.data.langid.languages == ["en", "de"]
    assert cfg.run.name == "my run"  # not a TOML literal: kept as a string


def test_parse_overrides_rejects_items_without_equals():
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["data.workers"])


def test_unknown_key_names_the_key_the_source_and_the_closest_valid_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.langid.treshold=0.9"])
    msg = str(err.value)
    assert (
        "data.langid.treshold" in msg and "data.langid.threshold" in msg and "command-line overrides" in msg
    )
    path = tmp_path / "c.toml"
    path.write_text("[data.dedupe]\nthreshold = 0.7\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "data.dedupe" in str(err.value) and str(path) in str(err.value) and "data.dedup" in str(err.value)


def test_bad_value_names_the_key_and_the_input():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.langid.threshold=1.5"])
    assert "data.langid.threshold" in str(err.value) and "1.5" in str(err.value)
    with pytest.raises(ConfigError, match="data.extract.extractor"):
        load_config(None, ["data.extract.extractor=lynx"])


def test_cross_field_validation_message():
    with pytest.raises(ConfigError, match="overlap"):
        load_config(None, ["data.chunk.size=100", "data.chunk.overlap=200"])


def test_override_through_a_value_is_refused():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["data.workers.x=1"])


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[data\nworkers = 2\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_fingerprint_is_stable_and_sensitive():
    a, b = load_config(), load_config()
    assert fingerprint(a) == fingerprint(b)
    c = load_config(None, ["data.dedup.threshold=0.7"])
    assert fingerprint(c) != fingerprint(a)
    assert diff_keys(to_dict(a), to_dict(c)) == ["data.dedup.threshold"]


def test_written_config_loads_back_to_the_same_fingerprint(tmp_path):
    cfg = load_config(None, ["train.optim.warmup_steps=10", "checkpoint.async=true"])
    fp = write_resolved(cfg, tmp_path, section="all")
    again = load_config(tmp_path / "config.toml")
    assert fingerprint(again) == fp
    assert again.checkpoint.async_save is True


def test_samples_expansion(monkeypatch, tmp_path):
    monkeypatch.setenv("ORELINE_SAMPLES", str(tmp_path))
    assert samples_dir() == tmp_path.resolve()
    assert expand("{samples}/web-archives") == f"{tmp_path.resolve()}/web-archives"


def test_valid_keys_cover_nested_sections():
    keys = valid_keys()
    assert {"data", "data.dedup", "data.dedup.threshold", "checkpoint.async", "train.optim.lr"} <= set(keys)


def test_config_from_dict_forbids_extra_at_top_level():
    with pytest.raises(ConfigError, match="unknown key 'trian'"):
        config_from_dict({"trian": {"steps": 1}})


def test_cli_config_show_and_keys():
    from typer.testing import CliRunner

    from oreline.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["config", "show", "data.workers=3"])
    assert shown.exit_code == 0, shown.output
    assert f"# fingerprint {fingerprint(load_config(None, ['data.workers=3']))}" in shown.output
    assert "workers = 3" in shown.output
    keys = runner.invoke(app, ["config", "keys"])
    assert (
        keys.exit_code == 0
        and "data.langid.threshold" in keys.output
        and "minimum lid.176 score" in keys.output
    )
    precision = next(line for line in keys.output.splitlines() if line.startswith("train.precision "))
    assert "fp32, bf16 or fp8" in precision
    assert all(f"train.{k} " in keys.output for k in ("fp8_recipe", "fp8_filter", "fp8_emulate", "attention"))
    assert load_config(None, ["train.precision=fp8"]).train.precision == "fp8"


# ---------------------------------------------------------------------------------------------
# bad values and bad files through the real command line: a clear error, never a traceback


BAD_VALUES = [
    ("model.n_heads=0", "model.n_heads"),
    ("train.optim.lr=nan", "train.optim.lr"),
    ("checkpoint.every=-5", "checkpoint.every"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last"),
    ("data.dedup.num_perm=0", "data.dedup.num_perm"),
    ("data.dedup.shingle_words=0", "data.dedup.shingle_words"),
    ("data.extract.timeout_s=0", "data.extract.timeout_s"),
    ("data.max_shard_bytes=0", "data.max_shard_bytes"),
    ("export.max_shard_bytes=0", "export.max_shard_bytes"),
    ("tokenizer.vocab_size=1000000000", "tokenizer.vocab_size"),
]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        *BAD_VALUES,
        ("train.optim.lr=-1e-3", "train.optim.lr"),
        ("train.optim.lr=inf", "train.optim.lr"),
        ("model.dim=0", "model.dim"),
        ("model.vocab_size=1000000000", "model.vocab_size"),
        # intervals: log_every = 0 used to pass and divide by zero after step 1 (n % 0)
        ("train.log_every=0", "train.log_every"),
        ("train.eval_every=-1", "train.eval_every"),
        ("train.eval_sequences=0", "train.eval_sequences"),
        ("train.generate_every=-1", "train.generate_every"),
        ("checkpoint.keep_every=-1", "checkpoint.keep_every"),
        ("checkpoint.model_only_every=-2", "checkpoint.model_only_every"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(f"{key} in ")


def test_cli_refuses_bad_values_naming_every_key(oreline_cli):
    """One run with every bad value: each is named (pydantic reports them all), no traceback."""
    code, out = oreline_cli("config", "show", *(o for o, _ in BAD_VALUES))
    assert code == 2, out
    assert "Traceback" not in out and "oreline config keys" in out
    for _override, key in BAD_VALUES:
        assert f"{key} in " in out, (key, out)


def test_zero_checkpoint_interval_still_disables_checkpoints():
    assert load_config(None, ["checkpoint.every=0"]).checkpoint.every == 0  # documented: 0 disables


def test_dim_not_divisible_by_heads_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"model.dim \(100\) is not divisible by model.n_heads \(8\)"):
        load_config(None, ["model.dim=100", "model.n_heads=8"])


def test_cli_refuses_a_binary_config_file(tmp_path, oreline_cli):
    path = tmp_path / "binary.toml"
    path.write_bytes(bytes(range(256)) * 8)  # not UTF-8: 0x80 is a continuation byte with no lead
    code, out = oreline_cli("config", "show", "-c", str(path))
    assert code == 2 and "Traceback" not in out, out
    assert f"{path} is not UTF-8 text" in out and "binary" in out


@pytest.mark.parametrize("nesting", ["[" * 100_000 + "]" * 100_000, "{a = " * 100_000 + "1" + "}" * 100_000])
def test_cli_refuses_a_config_nested_100k_deep(tmp_path, nesting, oreline_cli):
    path = tmp_path / "deep.toml"
    path.write_text(f"x = {nesting}\n")
    code, out = oreline_cli("config", "show", "-c", str(path))
    assert code == 2 and "Traceback" not in out, out
    assert f"{path} is nested too deeply" in out


def test_an_override_nested_100k_deep_is_a_string_not_a_crash():
    with pytest.raises(ConfigError, match="run.seed"):  # the string is then refused as a seed, by key
        load_config(None, ["run.seed=" + "[" * 100_000])
