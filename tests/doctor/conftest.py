"""Fixtures: a healthy manufactured run (built once per session, copied per test)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# Test folders are not packages (--import-mode=importlib): load the factory by path and register
# it, so test modules (here and in tests/report) can `import_module("oreline_test_run_factory")`.
FACTORY = "oreline_test_run_factory"
if FACTORY not in sys.modules:
    _spec = importlib.util.spec_from_file_location(FACTORY, Path(__file__).with_name("run_factory.py"))
    sys.modules[FACTORY] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[FACTORY])
run_factory = sys.modules[FACTORY]


@pytest.fixture(scope="session")
def healthy_template(tmp_path_factory) -> Path:
    return run_factory.session_template(tmp_path_factory)


@pytest.fixture
def healthy_run(healthy_template, tmp_path) -> Path:
    """A fresh copy the test may break."""
    return run_factory.copy_run(healthy_template, tmp_path / "run")
