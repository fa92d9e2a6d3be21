"""Fixtures: the same healthy manufactured run as tests/doctor (its factory, loaded by path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

FACTORY = "oreline_test_run_factory"
if FACTORY not in sys.modules:  # test folders are not packages (--import-mode=importlib)
    _spec = importlib.util.spec_from_file_location(FACTORY, Path(__file__).parents[1] / "doctor" / "run_factory.py")
    sys.modules[FACTORY] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[FACTORY])
run_factory = sys.modules[FACTORY]


@pytest.fixture(scope="session")
def report_template(tmp_path_factory) -> Path:
    return run_factory.session_template(tmp_path_factory)


@pytest.fixture
def report_run(report_template, tmp_path) -> Path:
    """A fresh copy the test may change."""
    return run_factory.copy_run(report_template, tmp_path / "run")
