"""Shared fixtures. Sample data is located by ORELINE_SAMPLES (default ../shared/data)."""

from __future__ import annotations

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
