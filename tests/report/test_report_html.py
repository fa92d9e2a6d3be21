"""report.html: every section present, self-contained, escaped, numbers from the artifacts, and
rendered by a real headless Chromium into a non-blank page."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from importlib import import_module

import pytest
from typer.testing import CliRunner

from oreline.report.html import SECTION_IDS, render_report, write_report

run_factory = import_module("oreline_test_run_factory")  # registered by tests/report/conftest.py

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Sections(HTMLParser):
    """Section ids, image sources and every tag name of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.images: list[str] = []
        self.tags: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "section" and "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag in ("a", "link") and "href" in attrs:
            self.links.append(attrs["href"])


def parse(text: str) -> Sections:
    p = Sections()
    p.feed(text)
    return p


def section(text: str, sid: str) -> str:
    match = re.search(rf'<section id="{sid}">(.*?)</section>', text, re.S)
    assert match, f"section {sid} missing"
    return match.group(1)


@pytest.fixture(scope="module")
def healthy_report(healthy_template, tmp_path_factory):
    """(run, report text) of one unchanged healthy run, shared by the read-only tests."""
    run = run_factory.copy_run(healthy_template, tmp_path_factory.mktemp("healthy-report") / "run")
    path = write_report(run)
    assert path == run / "report.html"
    return run, path.read_text(encoding="utf-8")


def test_every_section_is_present_and_filled(healthy_report):
    _, text = healthy_report
    page = parse(text)
    assert page.ids == SECTION_IDS
    empty = [sid for sid in SECTION_IDS if "not available" in section(text, sid)]
    assert empty == [], f"sections without data in a complete run: {empty}"


def test_report_is_self_contained(healthy_report):
    _, text = healthy_report
    page = parse(text)
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    assert all(href.startswith("#") for href in page.links)
    assert "http://" not in re.sub(
        r"<code>.*?</code>|<td>.*?</td>", "", text
    )  # only artifact values may hold URLs
    assert (
        len(page.images) == 13
    )  # funnel, languages, lengths, loss ×2, mixture ×2, lr, grad norm, throughput, memory, downstream ×2
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_numbers_come_from_the_artifacts(healthy_report):
    healthy_run, text = healthy_report
    stats = json.loads((healthy_run / "data" / "stats.json").read_text())
    first, last = stats["steps"][0]["docs_in"], stats["steps"][-1]["docs_out"]
    assert f"{last:,} of {first:,} documents kept ({100 * last / first:.2f}%)" in section(text, "funnel")
    assert "<td>240</td>" in section(text, "lengths")  # documents in the Parquet shard
    manifest = json.loads((healthy_run / "tokens" / "manifest.json").read_text())
    assert f"{manifest['splits']['train']['tokens']:,}" in section(text, "tokens")
    assert manifest["tokenizer_fingerprint"] in section(text, "fingerprints")
    assert "step-00000200 (latest)" in section(text, "checkpoints")
    assert "loss_spike" in section(text, "events")
    assert "no known failure signature" in section(text, "doctor")


def test_artifact_text_is_escaped(healthy_run):
    evil = "<script>alert('x')</script><img src=x onerror=alert(1)>"

    def add_generation(rec):
        if rec["type"] == "generation":
            rec["text"] = evil
        return rec

    run_factory.rewrite_metrics(healthy_run, add_generation)
    stats_path = healthy_run / "data" / "stats.json"
    stats = json.loads(stats_path.read_text())
    stats["errors"] = [{"file": "<b>crawl.warc.gz</b>", "offset": 7, "error": evil}]
    stats_path.write_text(json.dumps(stats))
    text = render_report(healthy_run)
    assert "<script>" not in text and "onerror=alert(1)>" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in section(text, "generations")
    assert "&lt;b&gt;crawl.warc.gz&lt;/b&gt;" in section(text, "funnel")


def test_missing_and_broken_artifacts_are_named_not_fatal(healthy_run):
    (healthy_run / "data" / "stats.json").write_text("{ torn")
    shutil.rmtree(healthy_run / "tokenizer")
    (healthy_run / "metrics.jsonl").unlink()
    text = render_report(healthy_run)
    assert parse(text).ids == SECTION_IDS
    assert "not available: " in section(text, "funnel") and "unreadable" in section(text, "funnel")
    assert "tokenizer_stats.json absent" in section(text, "tokenizer")
    for sid in ("loss", "lr", "grad-norm", "throughput", "memory"):
        assert "not available: no train records" in section(text, sid)
    assert "not available" not in section(text, "lengths")  # the Parquet shards are still there


def test_truncated_checkpoint_shows_in_the_table_and_the_doctor_section(healthy_run):
    shard = healthy_run / "checkpoints" / "step-00000200" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:500])
    text = render_report(healthy_run)
    assert "missing or resized: __0_0.distcp" in section(text, "checkpoints")
    assert "checkpoint_unloadable" in section(text, "doctor")


def test_empty_run_directory_still_gives_a_report(tmp_path):
    text = write_report(tmp_path).read_text()
    assert parse(text).ids == SECTION_IDS
    assert text.count("not available:") >= 12


def test_cli_writes_the_report(healthy_run):
    from oreline.cli import app

    result = CliRunner().invoke(app, ["report", str(healthy_run)])
    assert result.exit_code == 0, result.output
    assert (healthy_run / "report.html").stat().st_size > 50_000


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip(
            "chromium is not installed (scripts/test.sh installs Debian's chromium with apt-get when root)"
        )
    return exe


def test_chromium_renders_a_non_blank_page_with_every_section(healthy_report, tmp_path):
    from PIL import Image

    exe = _chromium()
    url = (healthy_report[0] / "report.html").resolve().as_uri()
    shot = tmp_path / "shot.png"
    common = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run(
        [*common, f"--screenshot={shot}", "--window-size=1280,4000", url],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file(), "chromium wrote no screenshot"
    with Image.open(shot) as im:
        gray = im.convert("L")
        hist = gray.histogram()
        assert gray.size == (1280, 4000)
    pixels = sum(hist)
    non_white = sum(hist[:245]) / pixels
    mean = sum(i * n for i, n in enumerate(hist)) / pixels
    variance = sum(n * (i - mean) ** 2 for i, n in enumerate(hist)) / pixels
    assert non_white > 0.05 and variance > 100, (non_white, variance)

    dom = subprocess.run(
        [*common, "--dump-dom", url], capture_output=True, timeout=120, check=False, text=True
    ).stdout
    assert parse(dom).ids == SECTION_IDS


def test_thinning_keeps_spikes_and_bounds_points():
    from oreline.report.plots import thin

    x = list(range(100_000))
    y = [1.0] * 100_000
    y[54_321] = 50.0
    xs, ys = thin(x, y, max_points=2000)
    assert len(xs) <= 2000 and 50.0 in ys and xs[ys.index(50.0)] == 54_321
    assert thin(x[:10], y[:10]) == (x[:10], y[:10])


def test_every_doctor_finding_links_to_a_section_of_the_report():
    from oreline.doctor.run import CHECKS
    from oreline.report.html import FINDING_SECTIONS

    assert set(FINDING_SECTIONS) == set(CHECKS)
    assert set(FINDING_SECTIONS.values()) <= set(SECTION_IDS)


def test_report_states_the_training_format_and_the_export(healthy_report):
    _, text = healthy_report
    body = section(text, "export")
    assert "trained on &lt;s&gt; text &lt;/s&gt;" in body and "prompts are fed as &lt;s&gt; prompt" in body
    assert "add_bos_token" in body and "<td>true</td>" in body
