"""The eval tests reuse the training layer's prose fixtures (tests/train/conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "oreline_test_train_fixtures"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).parents[1] / "train" / "conftest.py")
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])

prose_tokens = sys.modules[_NAME].prose_tokens
train_config = sys.modules[_NAME].train_config
one_thread = sys.modules[_NAME].one_thread
