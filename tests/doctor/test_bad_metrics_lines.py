"""Hostile metrics.jsonl lines (100k-deep nesting, 5,000-digit integers) are counted bad lines with
their line numbers, never a RecursionError / ValueError / OverflowError traceback."""

from __future__ import annotations

import sys

import pytest

from oreline.doctor.artifacts import MAX_INT_DIGITS, read_metrics
from oreline.doctor.run import diagnose_run

DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = '{"type": "train", "step": 7, "loss": ' + "9" * 5_000 + "}"
FLOAT_OVERFLOW = (
    '{"type": "train", "step": 8, "loss": ' + "9" * 400 + "}"
)  # parses under the 4300 limit, overflows float()


def add_lines(run, *lines: str) -> list[int]:
    """Append lines to the run's metrics.jsonl; their 1-based line numbers."""
    path = run / "metrics.jsonl"
    first = len(path.read_text().splitlines()) + 1
    with open(path, "a") as fh:
        fh.write("".join(line + "\n" for line in lines))
    return list(range(first, first + len(lines)))


def test_doctor_cli_counts_deep_and_huge_lines_with_their_numbers(healthy_run, oreline_cli):
    deep, huge, overflow = add_lines(healthy_run, DEEP, HUGE_INT, FLOAT_OVERFLOW)
    code, out = oreline_cli("doctor", "run", str(healthy_run), timeout=300)
    assert code == 0, out  # a warning, not a failure: the rest of the run is healthy
    assert "Traceback" not in out, out
    assert "metrics_unreadable" in out and "3 lines of metrics.jsonl skipped" in out
    assert f"line {deep}: nested too deeply" in out
    assert (
        f"line {huge}: integer with 5,000 digits" in out
        and f"line {overflow}: integer with 400 digits" in out
    )
    assert {f.check for f in diagnose_run(healthy_run)} == {"metrics_unreadable"}


@pytest.mark.parametrize("limit", [0, 4300, 10_000])
def test_what_counts_as_bad_does_not_depend_on_the_int_digit_limit(healthy_run, limit):
    """sys.set_int_max_str_digits is process-wide (0 lifts it); the reader applies its own limit."""
    add_lines(
        healthy_run,
        HUGE_INT,
        FLOAT_OVERFLOW,
        '{"type": "train", "step": 9, "tokens": ' + "1" * MAX_INT_DIGITS + "}",
    )
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        records, bad = read_metrics(healthy_run / "metrics.jsonl")
    finally:
        sys.set_int_max_str_digits(before)
    assert [why.split(" (")[0] for _, why in bad] == ["integer with 5,000 digits", "integer with 400 digits"]
    assert records["train"][-1]["tokens"] == int("1" * MAX_INT_DIGITS)  # 100 digits still read


def test_a_tokenizer_json_nested_100k_deep_is_a_finding_not_a_check_crash(healthy_run):
    (healthy_run / "tokenizer" / "tokenizer.json").write_text(DEEP)
    finding = next(f for f in diagnose_run(healthy_run) if f.check == "fingerprint_mismatch")
    assert finding.status == "fail" and "unreadable (RecursionError" in finding.evidence
    assert "re-run oreline tokenizer train" in finding.fix


def test_a_line_past_the_cap_is_a_bad_line_skipped_unread(healthy_run):
    """A metrics.jsonl line longer than MAX_METRICS_LINE_BYTES (a 1 GB line took 2.5 GB) is
    counted as a bad line with its number; the records after it are read."""
    from oreline.doctor.artifacts import MAX_METRICS_LINE_BYTES

    path = healthy_run / "metrics.jsonl"
    before, _ = read_metrics(path)
    with open(path, "a") as fh:
        fh.write('{"type": "note", "text": "' + "x" * (MAX_METRICS_LINE_BYTES + 1) + '"}\n')
        fh.write('{"type": "note", "text": "after"}\n')
    by_type, bad = read_metrics(path)
    assert [why for _, why in bad] == [f"longer than {MAX_METRICS_LINE_BYTES:,} bytes"]
    assert by_type["note"] == [{"type": "note", "text": "after"}]
    assert {k: len(v) for k, v in by_type.items() if k != "note"} == {k: len(v) for k, v in before.items()}
