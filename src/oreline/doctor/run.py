"""Run doctor: read a run directory's artifacts and name the known failure signatures.

`diagnose_run(run_dir)` returns the problems found (warn/fail `Finding`s, each with a stable id,
the evidence in numbers, steps and files, and the fix); a healthy run returns []. `run_checks`
also returns `skip` findings for checks whose artifacts are absent, which the CLI shows so the
user knows what was not checked. Nothing here raises on bad artifacts: an unreadable file is
itself evidence. Loading lives in doctor/artifacts.py (shared with the HTML report).

Signatures and thresholds (records are the `train` lines of metrics.jsonl, one per log step):

| id | signature |
|---|---|
| nan_loss | a train/eval loss that is NaN, ±inf or null, or a `nonfinite` event. fail when the last train loss is non-finite, warn when the run recovered |
| lr_constant | ≥ 3 records and max(lr) − min(lr) ≤ 1e-9·max(lr) while train.optim.schedule ≠ constant (or lr = 0 throughout) |
| loss_not_falling | ≥ 8 finite losses and mean(last quarter) > (1 − 0.05) · mean(first quarter) |
| eos_missing | a document in a token shard whose last token is not EOS (`</s>`, id from the tokenizer) |
| fingerprint_mismatch | sha256 of canonical tokenizer.json ≠ the tokenizer fingerprint in the manifest / a shard header / the start record / a checkpoint meta / an eval result (prefix match, so short forms compare); the manifest's or a checkpoint's data fingerprint ≠ the start record's |
| seq_len_exceeds_max | train.seq_len (config or start record) > the model's max_seq_len (start record, checkpoint meta, or the resolved preset) |
| data_wait_high | median data_wait_frac (else data_ms/step_ms) over records after the first > 0.25 (warn), > 0.5 (fail) |
| throughput_falling | ≥ 8 records after the first; median tokens/s of the last quarter < 0.75 × the first quarter's |
| global_batch_mismatch | start.global_batch tokens ≠ micro·accum·world·seq_len, ≠ configured_tokens, ≠ train.global_batch_tokens; or a record's tokens_in_step below the global batch |
| skipped_steps_high | ≥ 3 steps skipped by the stability guard and more than 2% of the steps run (warn), 10% (fail); the evidence names the kinds, the longest run of skips in a row and the first skip's values against its window |
| grad_spikes | ≥ 3 grad norms above 4 × the median of the 16 before them (≥ 8 before needed), or ≥ 3 `grad_spike` events |
| checkpoint_unloadable | `verify_checkpoint` (oreline.train.checkpoint.verify) fails, or — when that module is absent — meta.json is unreadable / lacks step / lists files that are missing; `latest` pointing nowhere |
| val_far_above_train | last eval: val_loss − train_loss > 0.5 nats and val_loss > 1.25 × train_loss |
| metrics_unreadable | lines of metrics.jsonl that are not JSON objects (warn) |
| data_errors | input errors recorded in data/stats.json (warn) |
| export_format | the run's export/ (HF folder, *.gguf) does not encode as the model was trained: its tokenizer adds no BOS or two, appends EOS, returns token_type_ids, or declares a context other than train.seq_len; a GGUF without add_bos_token or with add_eos_token (oreline.tokens.format) |

Sources: the stability signatures follow the practice of OPT (Zhang et al. 2022, logbook:
restarts after loss and grad-norm spikes, lowering the LR) and PaLM (Chowdhery et al. 2022,
§5.1: skipping batches around spikes); the data-wait and throughput checks are the usual
input-pipeline diagnostics (torch.profiler / tf.data guides: data wait above ~25% of step time
means the accelerator starves).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from rich.console import Console

from oreline.doctor.artifacts import (
    EOS_TOKEN,
    NotAvailable,
    RunArtifacts,
    document_ends,
    eos_id,
    is_finite,
    latest_target,
    load_run,
    read_json,
    same_fingerprint,
    series,
    shard_header_fingerprints,
    shard_paths,
    shards_module,
    step_of,
    tokenizer_fingerprint,
    verify_checkpoint_dir,
)
from oreline.doctor.env import Finding, print_findings

__all__ = [
    "CHECKS",
    "Finding",
    "NotAvailable",
    "RunArtifacts",
    "diagnose_run",
    "doctor_run_cli",
    "load_run",
    "run_checks",
]

LR_MIN_RECORDS = 3
LOSS_MIN_RECORDS = 8
LOSS_MIN_DROP = 0.05
DATA_WAIT_WARN = 0.25
DATA_WAIT_FAIL = 0.5
THROUGHPUT_MIN_RECORDS = 8
THROUGHPUT_MIN_RATIO = 0.75
GRAD_SPIKE_FACTOR = 4.0
GRAD_WINDOW = 16
GRAD_MIN_HISTORY = 8
GRAD_MIN_SPIKES = 3
SKIP_WARN_FRACTION = 0.02  # issue 35's bar: a healthy run skips at most 2% of its steps
SKIP_FAIL_FRACTION = 0.10
SKIP_MIN_COUNT = 3  # one NaN batch skipped in a short run is the guard working, not a finding
VAL_GAP_NATS = 0.5
VAL_GAP_RATIO = 1.25
MAX_LISTED = 8  # steps / files quoted in one evidence string


def _steps(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:MAX_LISTED]))
    return shown + (f" … ({len(steps)} in all)" if len(steps) > MAX_LISTED else "")


def _quarters(values: list[float]) -> tuple[list[float], list[float]]:
    q = max(1, len(values) // 4)
    return values[:q], values[-q:]


# ---------------------------------------------------------------------------------------------
# training-curve signatures


def check_nan_loss(run: RunArtifacts) -> list[Finding]:
    train, evals = run.records("train"), run.records("eval")
    if not train and not evals:
        raise NotAvailable("no train or eval records in metrics.jsonl")
    bad = [step_of(r) for r in train if "loss" in r and not is_finite(r["loss"])]
    bad_eval = [
        step_of(r)
        for r in evals
        if "val_loss" in r and not is_finite(r["val_loss"]) and r.get("val_targets") != 0
    ]  # an empty validation split has no loss, which is not NaN
    events = [e for e in run.records("event") if e.get("kind") == "nonfinite"]
    if not (bad or bad_eval or events):
        return []
    parts = []
    if bad:
        parts.append(f"train loss non-finite at steps {_steps(bad)}")
        before = [(s, v) for s, v in series(train, "loss") if s < bad[0]]
        if before:
            parts.append(f"last finite loss {before[-1][1]:.4g} at step {before[-1][0]}")
    if bad_eval:
        parts.append(f"validation loss non-finite at steps {_steps(bad_eval)}")
    if events:
        parts.append(
            f"{len(events)} nonfinite event(s) at steps {_steps([step_of(e) for e in events])}"
            f" (action: {', '.join(sorted({str(e.get('action')) for e in events}))})"
        )
    last = next((r for r in reversed(train) if "loss" in r), None)
    recovered = last is not None and is_finite(last["loss"])
    status = "warn" if recovered else "fail"
    if recovered:
        parts.append("later steps are finite again (the run recovered)")
    first_bad = min(bad + bad_eval + [step_of(e) for e in events])
    before = [
        c for c in run.checkpoint_dirs() if c.name.startswith("step-") and _checkpoint_step(c) < first_bad
    ]
    where = f" ({before[-1].name})" if before else ""
    return [
        Finding(
            "nan_loss",
            status,
            "; ".join(parts),
            f"resume from the last checkpoint before step {first_bad}{where} with a lower train.optim.lr "
            "and train.optim.grad_clip=1.0; use train.precision=fp32 if bf16; "
            "train.stability.action=rollback recovers automatically",
        )
    ]


def _checkpoint_step(ckpt: Path) -> int:
    return int(ckpt.name.rsplit("-", 1)[-1])  # checkpoint_dirs only yields (model-)step-N names


def check_lr_constant(run: RunArtifacts) -> list[Finding]:
    lrs = series(run.records("train"), "lr")
    if len(lrs) < LR_MIN_RECORDS:
        raise NotAvailable(f"{len(lrs)} train records with lr (need {LR_MIN_RECORDS})")
    schedule = run.cfg("train.optim.schedule")
    values = [v for _, v in lrs]
    lo, hi = min(values), max(values)
    if hi == 0:
        return [
            Finding(
                "lr_constant",
                "fail",
                f"lr is 0 at every logged step ({lrs[0][0]}–{lrs[-1][0]}, {len(lrs)} records)",
                "set train.optim.lr > 0; check the warmup is not longer than train.steps",
            )
        ]
    if schedule == "constant" or hi - lo > 1e-9 * hi:
        return []
    planned = run.start_list("schedule")
    planned_lrs = {
        round(float(p[1]), 12)
        for p in planned
        if isinstance(p, list | tuple) and len(p) == 2 and is_finite(p[1])
    }
    hint = (
        f"; the start record's schedule has {len(planned_lrs)} distinct values"
        if len(planned_lrs) > 1
        else ""
    )
    return [
        Finding(
            "lr_constant",
            "fail",
            f"lr stayed at {hi:.3g} from step {lrs[0][0]} to {lrs[-1][0]} ({len(lrs)} records) "
            f"though train.optim.schedule = {schedule}{hint}",
            "the scheduler is not applied to the optimizer: check that the loop sets each param group's lr "
            "every step (and that warmup/decay steps fit inside train.steps)",
        )
    ]


def check_loss_not_falling(run: RunArtifacts) -> list[Finding]:
    losses = series(run.records("train"), "loss")
    if len(losses) < LOSS_MIN_RECORDS:
        raise NotAvailable(f"{len(losses)} finite train losses (need {LOSS_MIN_RECORDS})")
    first, last = _quarters([v for _, v in losses])
    a, b = statistics.fmean(first), statistics.fmean(last)
    if b <= (1 - LOSS_MIN_DROP) * a:
        return []
    q = len(first)
    trend = "rose" if b > a else "fell only"
    return [
        Finding(
            "loss_not_falling",
            "fail",
            f"mean train loss {trend} from {a:.4g} (steps {losses[0][0]}–{losses[q - 1][0]}) to {b:.4g} "
            f"(steps {losses[-q][0]}–{losses[-1][0]}): {100 * (a - b) / a:+.1f}% (need ≥ {100 * LOSS_MIN_DROP:.0f}%)",
            "check the learning rate (lr_constant, too low or too high), that targets are the inputs shifted "
            "by one, and that batches are not the same data repeated",
        )
    ]


def check_val_far_above_train(run: RunArtifacts) -> list[Finding]:
    evals = [e for e in run.records("eval") if is_finite(e.get("val_loss"))]
    if not evals:
        raise NotAvailable("no eval records with a finite val_loss")
    last = evals[-1]
    step = step_of(last)
    train_loss = last.get("train_loss")
    source = "the eval record"
    if not is_finite(train_loss):
        near = [v for s, v in series(run.records("train"), "loss") if s <= step][-5:]
        if not near:
            raise NotAvailable(f"no train loss at or before eval step {step}")
        train_loss, source = statistics.fmean(near), f"the mean of the last {len(near)} train records"
    val = float(last["val_loss"])
    if not (val - train_loss > VAL_GAP_NATS and val > VAL_GAP_RATIO * train_loss):
        return []
    evidence = (
        f"at step {step} val_loss {val:.4g} vs train loss {train_loss:.4g} ({source}): "
        f"{val - train_loss:+.3g} nats, ×{val / train_loss:.2f}"
    )
    train_tokens = sum(
        int(s.get("tokens", 0)) for s in (run.manifest or {}).get("shards", []) if s.get("split") == "train"
    )
    seen = next(
        (r.get("tokens_seen") for r in reversed(run.records("train")) if is_finite(r.get("tokens_seen"))),
        None,
    )
    if train_tokens and seen:
        evidence += f"; {seen / train_tokens:.1f} epochs over {train_tokens:,} training tokens"
    return [
        Finding(
            "val_far_above_train",
            "warn",
            evidence,
            "the model memorizes its training data: add data (or repeat it fewer times), stop earlier, "
            "or raise weight decay; check the validation split comes from the same documents' distribution",
        )
    ]


def check_grad_spikes(run: RunArtifacts) -> list[Finding]:
    grads = series(run.records("train"), "grad_norm")
    events = [e for e in run.records("event") if e.get("kind") == "grad_spike"]
    if len(grads) < GRAD_MIN_HISTORY + 1 and not events:
        raise NotAvailable(f"{len(grads)} train records with grad_norm (need {GRAD_MIN_HISTORY + 1})")
    spikes = []
    for i in range(GRAD_MIN_HISTORY, len(grads)):
        ref = statistics.median(v for _, v in grads[max(0, i - GRAD_WINDOW) : i])
        if ref > 0 and grads[i][1] > GRAD_SPIKE_FACTOR * ref:
            spikes.append((grads[i][0], grads[i][1], ref))
    if len(spikes) < GRAD_MIN_SPIKES and len(events) < GRAD_MIN_SPIKES:
        return []
    parts = []
    if spikes:
        shown = ", ".join(f"step {s} ({v:.3g} vs median {m:.3g})" for s, v, m in spikes[:MAX_LISTED])
        parts.append(
            f"{len(spikes)} grad norms above {GRAD_SPIKE_FACTOR:g}× the median of the {GRAD_WINDOW} before: {shown}"
        )
    if events:
        parts.append(f"{len(events)} grad_spike events at steps {_steps([step_of(e) for e in events])}")
    return [
        Finding(
            "grad_spikes",
            "warn",
            "; ".join(parts),
            "lower train.optim.lr or lengthen warmup, keep train.optim.grad_clip=1.0, consider betas=(0.9, 0.95); "
            "inspect the batches at those steps for repeated or garbage documents",
        )
    ]


def check_skipped_steps_high(run: RunArtifacts) -> list[Finding]:
    """A guard that skips many steps trains on fewer batches than configured, silently: issue 35's
    storm skipped 277 of 300 steps and ended 2 nats above the unguarded run."""
    events = run.records("event")
    skips = sorted({step_of(e) for e in events if e.get("action") == "skip"})
    ran = max(
        [step_of(r) for kind in ("train", "event", "end", "checkpoint") for r in run.records(kind)], default=0
    )
    if ran <= 0:
        raise NotAvailable("no steps in metrics.jsonl")
    frac = len(skips) / ran
    if len(skips) < SKIP_MIN_COUNT or frac <= SKIP_WARN_FRACTION:
        return []
    kinds: dict[str, int] = {}
    for e in events:
        if e.get("action") == "skip":
            kinds[str(e.get("kind"))] = kinds.get(str(e.get("kind")), 0) + 1
    longest, start, best = 1, skips[0], (skips[0], skips[0])
    for prev, cur in zip(skips, skips[1:], strict=False):
        start = start if cur == prev + 1 else cur
        if cur - start + 1 > longest:
            longest, best = cur - start + 1, (start, cur)
    first = next(e for e in events if e.get("action") == "skip")
    rollbacks = sum(1 for e in events if e.get("kind") == "rollback")
    evidence = (
        f"{len(skips)} of {ran} steps skipped ({frac:.1%}): "
        + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        + f"; longest run {longest} in a row (steps {best[0]}-{best[1]}); {rollbacks} rollbacks; "
        f"first: {first.get('message', '')}"
    )
    return [
        Finding(
            "skipped_steps_high",
            "fail" if frac > SKIP_FAIL_FRACTION else "warn",
            evidence,
            "the run trained on fewer batches than configured: lower train.optim.lr or raise "
            "train.optim.warmup_steps; if these values are the run's normal level, raise "
            "train.stability.grad_spike_min_ratio / z_threshold, and keep train.stability.max_consecutive_skips "
            "on so a storm escalates",
        )
    ]


# ---------------------------------------------------------------------------------------------
# throughput signatures


def check_data_wait_high(run: RunArtifacts) -> list[Finding]:
    train = run.records("train")[1:]  # the first record includes start-up (compile, first shard open)
    fracs = [(step_of(r), float(r["data_wait_frac"])) for r in train if is_finite(r.get("data_wait_frac"))]
    source = "data_wait_frac"
    if not fracs:
        fracs = [
            (step_of(r), r["data_ms"] / r["step_ms"])
            for r in train
            if is_finite(r.get("data_ms")) and is_finite(r.get("step_ms")) and r["step_ms"] > 0
        ]
        source = "data_ms / step_ms"
    if not fracs:
        raise NotAvailable("no data_wait_frac or data_ms/step_ms in train records")
    med = statistics.median(v for _, v in fracs)
    if med <= DATA_WAIT_WARN:
        return []
    status = "fail" if med > DATA_WAIT_FAIL else "warn"
    worst = max(fracs, key=lambda sv: sv[1])
    return [
        Finding(
            "data_wait_high",
            status,
            f"median {source} {100 * med:.0f}% over {len(fracs)} records (worst {100 * worst[1]:.0f}% at step "
            f"{worst[0]}); the model waits for batches",
            "keep token shards on local disk, raise loader prefetch/workers, and check nothing else "
            "competes for the CPU cores",
        )
    ]


def check_throughput_falling(run: RunArtifacts) -> list[Finding]:
    train = run.records("train")[1:]
    tps = series(train, "tokens_per_s")
    if len(tps) < THROUGHPUT_MIN_RECORDS:
        raise NotAvailable(
            f"{len(tps)} train records with tokens_per_s after the first (need {THROUGHPUT_MIN_RECORDS})"
        )
    first, last = _quarters([v for _, v in tps])
    a, b = statistics.median(first), statistics.median(last)
    if b >= THROUGHPUT_MIN_RATIO * a:
        return []
    q = len(first)
    evidence = (
        f"median tokens/s fell from {a:,.0f} (steps {tps[0][0]}–{tps[q - 1][0]}) to {b:,.0f} "
        f"(steps {tps[-q][0]}–{tps[-1][0]}): ×{b / a:.2f}"
    )
    rss = series(train, "rss_mb")
    if len(rss) >= 2 and rss[-1][1] > 1.2 * rss[0][1]:
        evidence += f"; RSS grew {rss[0][1]:,.0f} → {rss[-1][1]:,.0f} MB"
    return [
        Finding(
            "throughput_falling",
            "warn",
            evidence,
            "look for growing memory (a tensor kept across steps, e.g. loss without .item()), "
            "synchronous checkpoint saves, thermal throttling, or other jobs on the machine",
        )
    ]


def check_global_batch_mismatch(run: RunArtifacts) -> list[Finding]:
    gb = run.start_dict("global_batch")
    if not gb:
        raise NotAvailable("no start record with global_batch in metrics.jsonl")
    problems = []
    tokens = gb.get("tokens")
    dims = [gb.get(k) for k in ("micro", "accum", "world", "seq_len")]
    if all(is_finite(d) for d in dims) and is_finite(tokens):
        product = math.prod(int(d) for d in dims)
        if product != tokens:
            problems.append(
                f"start record: tokens {tokens:,} ≠ micro {dims[0]} × accum {dims[1]} × world {dims[2]} "
                f"× seq_len {dims[3]} = {product:,}"
            )
    configured = gb.get("configured_tokens")
    if is_finite(configured) and is_finite(tokens) and configured != tokens:
        problems.append(f"global batch {tokens:,} tokens ≠ configured {configured:,}")
    cfg_tokens = run.cfg("train.global_batch_tokens")
    if is_finite(cfg_tokens) and is_finite(tokens) and cfg_tokens != tokens and cfg_tokens != configured:
        problems.append(f"config train.global_batch_tokens = {cfg_tokens:,} but the run used {tokens:,}")
    if is_finite(tokens):
        short = [
            (step_of(r), r["tokens_in_step"])
            for r in run.records("train")
            if is_finite(r.get("tokens_in_step")) and r["tokens_in_step"] < tokens
        ]
        if short:
            worst = min(short, key=lambda sv: sv[1])
            problems.append(
                f"{len(short)} steps had fewer tokens than the global batch {tokens:,} "
                f"(steps {_steps([s for s, _ in short])}; fewest {worst[1]:,} at step {worst[0]})"
            )
    if not problems:
        return []
    return [
        Finding(
            "global_batch_mismatch",
            "fail",
            "; ".join(problems),
            "make train.micro_batch × grad_accum × world size × seq_len equal train.global_batch_tokens "
            "(or unset it); a short step means a rank ran out of data or dropped a micro-batch",
        )
    ]


# ---------------------------------------------------------------------------------------------
# data, tokenizer and configuration signatures


def _model_max_seq_len(run: RunArtifacts) -> tuple[int | None, str]:
    model = run.start_dict("model")
    if is_finite(model.get("max_seq_len")):
        return int(model["max_seq_len"]), "the start record"
    for ckpt in reversed(run.checkpoint_dirs()):
        meta, _ = read_json(ckpt / "meta.json")
        args = (meta or {}).get("model_args") or {}
        if is_finite(args.get("max_seq_len")):
            return int(args["max_seq_len"]), f"{ckpt.name}/meta.json"
    try:
        from oreline.config import ModelConfig
        from oreline.model.presets import resolve_model_args

        model_cfg = run.config.get("model", {}) if isinstance(run.config.get("model"), dict) else {}
        args = resolve_model_args(ModelConfig(**model_cfg), vocab_size=1)
        return int(args.max_seq_len), f"model preset {model_cfg.get('preset', ModelConfig().preset)!r}"
    except Exception:  # an unresolvable model section leaves the check without a maximum
        return None, ""


def check_seq_len_exceeds_max(run: RunArtifacts) -> list[Finding]:
    max_len, source = _model_max_seq_len(run)
    if max_len is None:
        raise NotAvailable(
            "model max_seq_len unknown (no start record, checkpoint meta or resolvable preset)"
        )
    candidates = [
        ("config train.seq_len", run.cfg("train.seq_len")),
        ("start record global_batch.seq_len", run.start_dict("global_batch").get("seq_len")),
    ]
    over = [f"{name} = {value:,}" for name, value in candidates if is_finite(value) and value > max_len]
    if not over:
        return []
    return [
        Finding(
            "seq_len_exceeds_max",
            "fail",
            f"{'; '.join(over)} > model max_seq_len {max_len:,} ({source})",
            f"set train.seq_len ≤ {max_len} or raise model.max_seq_len (RoPE positions beyond the "
            "trained range need rope_scaling)",
        )
    ]


def check_fingerprint_mismatch(run: RunArtifacts) -> list[Finding]:
    tok_json = run.tokenizer_dir / "tokenizer.json"
    if not tok_json.is_file():
        raise NotAvailable(f"{tok_json} absent")
    try:
        actual = tokenizer_fingerprint(tok_json)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        return [
            Finding(
                "fingerprint_mismatch",
                "fail",
                f"{tok_json} unreadable ({type(exc).__name__}: {exc})",
                "re-run oreline tokenizer train",
            )
        ]
    claims: list[tuple[str, str]] = []
    if run.manifest and run.manifest.get("tokenizer_fingerprint"):
        claims.append(("tokens/manifest.json", run.manifest["tokenizer_fingerprint"]))
    claims += [(f"shard {name}", fp) for name, fp in shard_header_fingerprints(run)]
    if run.start.get("tokenizer_fingerprint"):
        claims.append(("metrics.jsonl start record", run.start["tokenizer_fingerprint"]))
    metas = [(c.name, read_json(c / "meta.json")[0] or {}) for c in run.checkpoint_dirs()]
    claims += [
        (f"checkpoint {name}", m["tokenizer_fingerprint"])
        for name, m in metas
        if m.get("tokenizer_fingerprint")
    ]
    evals = (
        [(p.name, read_json(p)[0]) for p in sorted((run.root / "eval").glob("*.json"))]
        if (run.root / "eval").is_dir()
        else []
    )
    claims += [
        (f"eval/{name}", e["tokenizer_fingerprint"])
        for name, e in evals
        if isinstance(e, dict) and e.get("tokenizer_fingerprint")
    ]
    if not claims:
        raise NotAvailable("no manifest, shard, start record or checkpoint records a tokenizer fingerprint")
    wrong = [f"{where} has {str(fp)[:12]}" for where, fp in claims if not same_fingerprint(fp, actual)]
    start_data = run.start.get("data_fingerprint")
    manifest_data = (run.manifest or {}).get("data_fingerprint")
    if start_data and manifest_data and not same_fingerprint(start_data, manifest_data):
        wrong.append(
            f"tokens/manifest.json data fingerprint {str(manifest_data)[:12]} ≠ the start record's "
            f"{str(start_data)[:12]} (the shards were rebuilt after training started)"
        )
    if start_data:
        wrong += [
            f"checkpoint {name} data fingerprint {str(m['data_fingerprint'])[:12]} ≠ start record's {str(start_data)[:12]}"
            for name, m in metas
            if m.get("data_fingerprint") and not same_fingerprint(m["data_fingerprint"], start_data)
        ]
    if not wrong:
        return []
    shown = tok_json.relative_to(run.root) if tok_json.is_relative_to(run.root) else tok_json
    return [
        Finding(
            "fingerprint_mismatch",
            "fail",
            f"{shown} is {actual[:12]}; disagreeing: {'; '.join(wrong[:MAX_LISTED])}",
            "the token shards (or checkpoint) were made with another tokenizer: re-run oreline tokenize "
            "with this tokenizer, or point train.tokenizer at the one the shards were built with",
        )
    ]


def check_eos_missing(run: RunArtifacts) -> list[Finding]:
    shards = shard_paths(run)
    if not shards:
        raise NotAvailable("no shards listed in tokens/manifest.json")
    eos = eos_id(run)
    reader = shards_module()
    problems, docs_total, docs_bad = [], 0, 0
    for name, path in shards:
        try:
            last = document_ends(reader.open_shard(path))
        except Exception as exc:  # a shard that cannot be read is evidence, not a crash
            problems.append(f"{name} unreadable ({type(exc).__name__}: {exc})")
            continue
        n = len(last)
        missing = [int(i) for i in (last != eos).nonzero()[0]]
        docs_total += n
        if missing:
            docs_bad += len(missing)
            problems.append(
                f"{name}: {len(missing):,} of {n:,} documents (e.g. #{', #'.join(map(str, missing[:5]))})"
            )
    if not problems:
        return []
    head = (
        f"{docs_bad:,} of {docs_total:,} documents do not end with {EOS_TOKEN} (id {eos}): "
        if docs_bad
        else ""
    )
    return [
        Finding(
            "eos_missing",
            "fail",
            head + "; ".join(problems[:MAX_LISTED]),
            "re-run oreline tokenize (it appends EOS to every document); without EOS the model never "
            "learns where a document ends and generations run on",
        )
    ]


def check_checkpoints(run: RunArtifacts) -> list[Finding]:
    ckpts = run.checkpoint_dirs()
    latest = run.root / "checkpoints" / "latest"
    if not ckpts and not latest.exists() and not latest.is_symlink():
        raise NotAvailable("no checkpoints/(model-)step-* folders")
    bad, good = [], []
    for ckpt in ckpts:
        ok, problems = verify_checkpoint_dir(ckpt, hash_files=run.hash_checkpoints)
        if not ok:
            bad.append(f"{ckpt.name}: {'; '.join(problems[:3])}")
        elif ckpt.name.startswith("step-"):
            good.append(ckpt.name)  # only full checkpoints can be resumed from
    if latest.is_symlink() or latest.exists():
        target = latest_target(latest)
        if target is None or not target.is_dir():
            bad.append(f"checkpoints/latest points to {target or 'nothing'}, which does not exist")
    if not bad:
        return []
    fix = (
        f"resume from {good[-1]} (oreline train --resume {run.root / 'checkpoints' / good[-1]}) and delete the "
        "broken folder"
        if good
        else "no valid full checkpoint is left: retrain from scratch (--resume none)"
    )
    return [Finding("checkpoint_unloadable", "fail", " | ".join(bad[:MAX_LISTED]), fix)]


def check_metrics_unreadable(run: RunArtifacts) -> list[Finding]:
    if not run.metrics_bad_lines:
        return []
    bad = run.metrics_bad_lines
    listed = "; ".join(f"line {n}: {why[:120]}" for n, why in bad[:MAX_LISTED]) + (
        "; …" if len(bad) > MAX_LISTED else ""
    )
    return [
        Finding(
            "metrics_unreadable",
            "warn",
            f"{len(bad)} line{'s' if len(bad) != 1 else ''} of metrics.jsonl skipped, not readable JSON objects ({listed})",
            "a crash mid-write leaves a torn last line (harmless); torn lines elsewhere mean two writers, and "
            "lines nested thousands deep or with 100-digit numbers were not written by oreline: look at who wrote them",
        )
    ]


def check_data_errors(run: RunArtifacts) -> list[Finding]:
    if run.data_stats is None:
        raise NotAvailable("data/stats.json absent")
    errors = run.data_stats.get("errors") or []
    if not errors:
        return []
    first = errors[0] if isinstance(errors[0], dict) else {"error": errors[0]}
    return [
        Finding(
            "data_errors",
            "warn",
            f"{len(errors)} input errors in data/stats.json (first: {first.get('file')} at offset "
            f"{first.get('offset')}: {first.get('error')})",
            "inspect the files named; a truncated download re-fetched fixes most of them",
        )
    ]


def check_export_format(run: RunArtifacts) -> list[Finding]:
    from oreline.tokens.format import check_inference_tokenizer, convention, describe

    export = run.root / "export"
    ggufs = sorted(export.glob("*.gguf")) if export.is_dir() else []
    if not (export / "tokenizer.json").is_file() and not ggufs:
        raise NotAvailable("no export/tokenizer.json or export/*.gguf")
    manifest = run.manifest or {}
    bos = int(manifest["bos_id"]) if is_finite(manifest.get("bos_id")) else 1
    eos = int(manifest["eos_id"]) if is_finite(manifest.get("eos_id")) else eos_id(run)
    context = run.cfg("train.seq_len")
    context = int(context) if is_finite(context) else None
    problems = []
    if (export / "tokenizer.json").is_file():
        problems += [f"export/{p}" for p in check_inference_tokenizer(export, bos, eos, context)]
        config, why = read_json(export / "config.json")
        if config is None:
            problems.append(f"export/config.json: {why}")
        elif context is not None and config.get("max_position_embeddings") != context:
            problems.append(
                f"export/config.json max_position_embeddings={config.get('max_position_embeddings')!r}, "
                f"trained context {context}"
            )
    for path in ggufs:
        problems += [f"export/{path.name}: {p}" for p in _gguf_format_problems(path, bos, eos, context)]
    if not problems:
        return []
    return [
        Finding(
            "export_format",
            "fail",
            "; ".join(problems[:MAX_LISTED]) + f" — the model was {describe(convention(bos, eos))}",
            "re-export with this oreline (oreline export RUN --out DIR, --format gguf --out FILE.gguf): "
            "clients fed another format continue and score text differently",
        )
    ]


def _gguf_format_problems(path: Path, bos: int, eos: int, context: int | None) -> list[str]:
    from oreline.export.gguf import read_gguf_metadata

    try:  # bounded, regular files only: a FIFO or a 60M-item array is a finding, not a hang
        fields = read_gguf_metadata(
            path,
            lambda k: k.startswith(
                ("tokenizer.ggml.add_", "tokenizer.ggml.bos", "tokenizer.ggml.eos", "llama.context")
            ),
        )
    except Exception as exc:  # an unreadable file is the finding
        return [f"unreadable ({type(exc).__name__}: {exc})"]
    problems = []
    if fields.get("tokenizer.ggml.add_bos_token") is not True:
        problems.append(f"add_bos_token={fields.get('tokenizer.ggml.add_bos_token')!r}")
    if fields.get("tokenizer.ggml.add_eos_token"):
        problems.append("add_eos_token=True")
    if fields.get("tokenizer.ggml.bos_token_id") != bos or fields.get("tokenizer.ggml.eos_token_id") != eos:
        problems.append(
            f"bos/eos ids {fields.get('tokenizer.ggml.bos_token_id')}/{fields.get('tokenizer.ggml.eos_token_id')}"
            f" (shards use {bos}/{eos})"
        )
    if context is not None and fields.get("llama.context_length") != context:
        problems.append(f"context_length={fields.get('llama.context_length')!r}, trained context {context}")
    return problems


CHECKS = {
    "nan_loss": check_nan_loss,
    "lr_constant": check_lr_constant,
    "loss_not_falling": check_loss_not_falling,
    "eos_missing": check_eos_missing,
    "fingerprint_mismatch": check_fingerprint_mismatch,
    "seq_len_exceeds_max": check_seq_len_exceeds_max,
    "data_wait_high": check_data_wait_high,
    "throughput_falling": check_throughput_falling,
    "global_batch_mismatch": check_global_batch_mismatch,
    "grad_spikes": check_grad_spikes,
    "skipped_steps_high": check_skipped_steps_high,
    "checkpoint_unloadable": check_checkpoints,
    "val_far_above_train": check_val_far_above_train,
    "metrics_unreadable": check_metrics_unreadable,
    "data_errors": check_data_errors,
    "export_format": check_export_format,
}


def run_checks(run: RunArtifacts | str | Path) -> list[Finding]:
    """Every check's problems, plus a `skip` finding for each check that could not run."""
    run = run if isinstance(run, RunArtifacts) else load_run(run)
    findings: list[Finding] = []
    for check_id, check in CHECKS.items():
        try:
            findings += check(run)
        except NotAvailable as exc:
            findings.append(Finding(check_id, "skip", f"not checked: {exc}"))
        except Exception as exc:  # one broken check must not hide the others
            findings.append(
                Finding(
                    check_id,
                    "warn",
                    f"check raised {type(exc).__name__}: {exc}",
                    "report this as an oreline bug; the other checks still ran",
                )
            )
    return findings


def diagnose_run(run_dir: str | Path) -> list[Finding]:
    """The problems found in a run (warn/fail findings); [] for a healthy run."""
    return [f for f in run_checks(run_dir) if f.status in ("warn", "fail")]


def doctor_run_cli(run_dir: Path, console: Console | None = None) -> int:
    from oreline.errors import InputError

    if not Path(run_dir).is_dir():
        raise InputError(
            f"run directory {run_dir} not found", "pass the folder holding metrics.jsonl (runs/NAME)"
        )
    findings = run_checks(run_dir)
    console = console or Console()
    problems = [f for f in findings if f.status != "skip"]
    print_findings(
        problems + [f for f in findings if f.status == "skip"], console, f"oreline doctor run {run_dir}"
    )
    if not problems:
        console.print("[green]no known failure signature found[/]")
    return 1 if any(f.status == "fail" for f in findings) else 0
