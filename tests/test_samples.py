"""The embedded sample set: complete, unaltered, documented, licensed, small, and what `{samples}` means."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from oreline.config import EMBEDDED_SAMPLES, expand, larger_samples, sample_problems, samples_dir
from oreline.errors import InputError

LICENSES = ("Apache-2.0", "BSD-3-Clause", "public domain")


def _listed(root: Path) -> dict[str, str]:
    pairs = (
        line.split(maxsplit=1) for line in (root / "SHA256SUMS").read_text().splitlines() if line.strip()
    )
    return {rel: digest for digest, rel in pairs}


def test_every_file_is_listed_and_matches_its_checksum(samples):
    listed = _listed(samples)
    on_disk = {str(p.relative_to(samples)) for p in samples.rglob("*") if p.is_file()}
    assert on_disk - {"SHA256SUMS", "SOURCES.md"} == set(listed), "every data and licence file has a checksum"
    assert sample_problems(samples) == []


def test_a_missing_or_altered_file_is_named(tmp_path):
    root = tmp_path / "samples"
    shutil.copytree(EMBEDDED_SAMPLES, root)
    (root / "web-archives/commoncrawl-samples/whirlwind.warc.gz").unlink()
    with (root / "english-prose/tinyshakespeare.txt.gz").open("ab") as fh:
        fh.write(b"\0")
    problems = sample_problems(root)
    assert len(problems) == 2
    assert problems[0].endswith("english-prose/tinyshakespeare.txt.gz: sha256 differs from SHA256SUMS")
    assert problems[1].endswith("web-archives/commoncrawl-samples/whirlwind.warc.gz: missing")


def test_sources_name_every_file_with_origin_licence_and_checksum(samples):
    sources = (samples / "SOURCES.md").read_text(encoding="utf-8")
    for rel, digest in _listed(samples).items():
        assert f"| `{rel}` | {(samples / rel).stat().st_size:,} | `{digest}` |" in sources, rel
    for licence in LICENSES:
        assert licence in sources
    for text in ("Apache-2.0.txt", "BSD-3-Clause.eugeneware-warc.txt", "PUBLIC-DOMAIN.md"):
        assert (samples / "licenses" / text).is_file()
    # the files left out for their licence stay out
    assert not list(samples.rglob("*servo*")) and not list(samples.rglob("*pywb*"))


def test_the_set_stays_small(samples):
    total = sum(p.stat().st_size for p in samples.rglob("*") if p.is_file())
    assert total <= 10_000_000, f"{total:,} bytes"


def test_samples_resolve_to_the_embedded_set_unless_overridden(monkeypatch, tmp_path):
    monkeypatch.delenv("ORELINE_SAMPLES", raising=False)
    monkeypatch.chdir(tmp_path)  # nothing outside the package is consulted
    assert samples_dir() == EMBEDDED_SAMPLES
    assert Path(expand("{samples}/web-archives")).is_dir()
    assert hashlib.sha256(Path(expand("{samples}/SHA256SUMS")).read_bytes()).hexdigest()
    monkeypatch.setenv("ORELINE_SAMPLES", str(tmp_path))
    assert samples_dir() == tmp_path.resolve()


def test_a_benchmark_asks_for_the_larger_set_by_name(monkeypatch):
    monkeypatch.delenv("ORELINE_SAMPLES", raising=False)
    assert larger_samples("english-prose/nltk-gutenberg.zip") == EMBEDDED_SAMPLES
    with pytest.raises(
        InputError, match=r"langid/lingua-testdata/sentences not found .* set ORELINE_SAMPLES"
    ):
        larger_samples("english-prose", "langid/lingua-testdata/sentences")


def test_repository_samples_link_is_the_package_folder():
    repo = Path(__file__).resolve().parents[1]
    assert (repo / "samples").resolve() == (repo / "src" / "oreline" / "samples").resolve()
    # and the package in use finds the same files (a clone's src, or an installed wheel's copy)
    assert sorted(p.name for p in EMBEDDED_SAMPLES.iterdir()) == sorted(
        p.name for p in (repo / "samples").iterdir()
    )


def test_wheel_and_sdist_carry_the_samples(tmp_path):
    """Built from a copy of the tree, the wheel holds every sample file and the sdist rebuilds it."""
    import subprocess
    import sys
    import tarfile
    import zipfile

    repo = Path(__file__).resolve().parents[1]
    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "README.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / name, tree / name)
    shutil.copytree(repo / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for hook in ("build_wheel", "build_sdist"):  # one process each: setuptools keeps state between them
        code = f"import sys; from setuptools import build_meta as b; b.{hook}(sys.argv[1])"
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "dist")], cwd=tree, check=True, capture_output=True
        )
    wanted = {f"oreline/samples/{rel}" for rel in _listed(EMBEDDED_SAMPLES)} | {
        "oreline/samples/SHA256SUMS",
        "oreline/samples/SOURCES.md",
    }
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wanted <= set(zipfile.ZipFile(wheel).namelist())
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/src/", 1)[-1] for n in tar.getnames()}
    assert wanted <= names
