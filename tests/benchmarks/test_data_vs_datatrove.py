"""benchmarks/data_vs_datatrove.py prints no ratio against a peer that measured nothing: one whose
extractor cannot import, or that kept no document (a broken peer environment once printed 78x
while datatrove kept 0)."""

import importlib.util
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "data_vs_datatrove", ROOT / "benchmarks" / "data_vs_datatrove.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_ratio_when_a_run_kept_no_document(bench):
    ok = ("datatrove (trafilatura)", 120, 40, 6.5, 9.0, {})
    assert bench.refusal([ok, ("oreline (resiliparse)", 120, 45, 0.9, 3.0, {})]) is None
    problem = bench.refusal([("datatrove (trafilatura)", 120, 0, 1.2, 3.0, {}), ok])
    assert problem and "kept 0" in problem and "no ratio" in problem
    assert bench.refusal([("datatrove (trafilatura)", 0, 0, 0.0, 1.0, {}), ok])


def test_a_peer_whose_extractor_cannot_import_is_refused(bench, tmp_path, monkeypatch):
    pytest.importorskip("trafilatura")
    # the peer's interpreter, broken the way lxml >= 5.2 breaks trafilatura: lxml_html_clean
    # missing; the benchmark's own datatrove script runs in it and must say so before any count
    broken = tmp_path / "python"
    broken.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        "\"import sys, runpy; sys.modules['lxml_html_clean'] = None; "
        'sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name=\'__main__\')" "$@"\n'
    )
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(bench, "PEER_PYTHON", broken)
    with pytest.raises(SystemExit) as exc:
        bench.run_datatrove("probe", [str(tmp_path / "none.warc.gz")], tmp_path)
    assert "cannot run" in str(exc.value) and "lxml_html_clean" in str(exc.value)
