"""`oreline report` on a run whose metrics.jsonl holds hostile lines: a report, not a traceback."""

from __future__ import annotations


def test_report_cli_writes_the_report_and_names_the_bad_lines(healthy_run, oreline_cli):
    path = healthy_run / "metrics.jsonl"
    first = len(path.read_text().splitlines()) + 1
    with open(path, "a") as fh:
        fh.write('{"a": ' * 50_000 + "\n")  # objects nested 50k deep, cut short
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
        fh.write('{"type": "train", "step": 7, "loss": ' + "9" * 5_000 + "}\n")
    code, out = oreline_cli("report", str(healthy_run), timeout=300)
    assert code == 0 and "Traceback" not in out, out
    html = (healthy_run / "report.html").read_text()
    assert "3 lines of metrics.jsonl skipped" in html
    for lineno in (first, first + 1, first + 2):
        assert f"line {lineno}: " in html
    assert 'id="loss"' in html and "not available" not in html.split('id="loss"')[1].split("</section>")[0]
