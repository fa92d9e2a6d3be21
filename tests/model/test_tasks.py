"""Task folders are read within bounds (issue 45 item 8; `-m hostile`): a line longer than
MAX_ITEM_BYTES is skipped and counted without being held, a folder past MAX_ITEMS items or
MAX_TASK_BYTES of lines and an oversized task.json are refused naming the file, and a FIFO named
task.json is refused, not waited on. The 1 GiB line under a memory cap, scored by `oreline eval
--tasks`, is tests/test_hostile_bounds.py's case task-long-line."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from oreline.errors import InputError
from oreline.model import tasks
from oreline.model.tasks import SHIPPED_DIR, read_task

COPA = (SHIPPED_DIR / "copa" / "items.jsonl").read_bytes().splitlines(keepends=True)


def _folder(path: Path, lines: list[bytes], meta: dict | None = None) -> Path:
    path.mkdir()
    (path / "task.json").write_text(json.dumps(meta or {"name": "t", "kind": "multiple_choice"}))
    (path / "items.jsonl").write_bytes(b"".join(lines))
    return path


@pytest.mark.hostile
def test_a_line_past_the_bound_is_skipped_and_counted_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks, "MAX_ITEM_BYTES", 4096)  # the bound is 1 MiB; the logic is the same
    long = b'{"context": "' + b"x" * 50_000 + b'", "choices": ["a", "b"], "gold": 0}\n'
    task = read_task(_folder(tmp_path / "t", COPA[:3] + [long] + COPA[3:6]))
    assert len(task.items) == 6 and task.skipped == 1
    assert "items.jsonl:4: longer than 4,096 bytes" in task.problems[0]


@pytest.mark.hostile
def test_too_many_items_or_bytes_are_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks, "MAX_ITEMS", 50)
    with pytest.raises(InputError, match=r"items.jsonl holds more than 50 items.*split it"):
        read_task(_folder(tmp_path / "many", COPA[:51]))
    assert len(read_task(_folder(tmp_path / "fifty", COPA[:50])).items) == 50
    monkeypatch.setattr(tasks, "MAX_TASK_BYTES", 4096)
    with pytest.raises(InputError, match=r"4,096 bytes of item lines"):
        read_task(_folder(tmp_path / "bytes", COPA[:50]))


@pytest.mark.hostile
def test_an_oversized_task_json_is_refused(tmp_path):
    folder = _folder(tmp_path / "meta", COPA[:3])
    (folder / "task.json").write_text(json.dumps({"kind": "cloze", "description": "d" * (1 << 17)}))
    with pytest.raises(InputError, match=r"task.json is longer than 65,536 bytes"):
        read_task(folder)
    (folder / "task.json").write_text(json.dumps({"kind": "multiple_choice", "delimiter": 7}))
    with pytest.raises(InputError, match=r"delimiter '7' is not a short string"):
        read_task(folder)


@pytest.mark.hostile
def test_a_fifo_named_task_json_is_refused_not_waited_on(tmp_path):
    folder = _folder(tmp_path / "fifo", COPA[:3])
    (folder / "task.json").unlink()
    os.mkfifo(folder / "task.json")
    result: list = []

    def read() -> None:
        try:
            read_task(folder)
        except InputError as exc:
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the old code's open() so that the thread ends
        with open(folder / "task.json", "w"):
            pass
        reader.join(10)
        pytest.fail("read_task blocked on a FIFO named task.json")
    assert result and "is a FIFO" in str(result[0])
