"""Shared fixtures. Sample data is located by ORELINE_SAMPLES (default ../shared/data)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from oreline.config import samples_dir


@pytest.fixture(scope="session")
def samples() -> Path:
    """The sample-data folder; tests that need it skip with the reason when it is absent."""
    path = samples_dir()
    if not (path / "web-archives").is_dir():
        pytest.skip(f"sample data not found at {path}: set ORELINE_SAMPLES to the shared data folder")
    return path


# The manufactured healthy run that tests/doctor and tests/report break one thing at a time.
# Test folders are not packages (--import-mode=importlib): load the factory by path once and
# register it, so test modules can `import_module("oreline_test_run_factory")`.
RUN_FACTORY = "oreline_test_run_factory"
if RUN_FACTORY not in sys.modules:
    _spec = importlib.util.spec_from_file_location(RUN_FACTORY, Path(__file__).parent / "doctor" / "run_factory.py")
    sys.modules[RUN_FACTORY] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[RUN_FACTORY])
run_factory = sys.modules[RUN_FACTORY]


@pytest.fixture(scope="session")
def healthy_template(tmp_path_factory) -> Path:
    """A healthy run (real tokenizer, shards, checkpoints), built once per session."""
    return run_factory.session_template(tmp_path_factory)


@pytest.fixture
def healthy_run(healthy_template, tmp_path) -> Path:
    """A fresh copy of the healthy run that the test may break."""
    return run_factory.copy_run(healthy_template, tmp_path / "run")
