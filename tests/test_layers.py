"""The package graph points one way: core → executors → tokens → model → data → train → eval → quality/export
→ doctor → report → stages → cli, with no import cycle between modules.

The graph is read from the source with `ast`, including imports inside functions: a lazy import
is still a dependency (it only moves the failure from import time to call time), so it counts.

docs/design.md's "Where is X?" list (concept → file) is checked here too: every path it names
exists and every layer has an entry, so the list cannot rot as files move.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Lower numbers sit lower. A module may import from its own group or from a lower one; two
# groups on the same level (quality, export) may not import each other.
LAYERS: dict[str, int] = {
    "core": 0,  # oreline/__init__, errors, config, runs, document, io, compat
    "executors": 1,  # where tasks run (local, ray, slurm): below tokens and data, which both use it
    "tokens": 2,
    "model": 3,
    "data": 4,
    "train": 5,
    "eval": 6,
    "quality": 7,
    "export": 7,
    "doctor": 8,
    "report": 9,
    "stages": 10,
    "ablation": 11,  # oreline ablate: runs the stages once per data recipe
    "cli": 12,
    "__main__": 13,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def group(module: str) -> str:
    """The layer group of `oreline.x.y`: its first component below oreline, or core."""
    parts = module.split(".")
    if len(parts) == 1:
        return "core"
    top = parts[1]
    if top in LAYERS:
        return top
    if len(parts) == 2:  # a top-level module that is not a named layer: errors, config, runs, …
        return "core"
    raise AssertionError(f"{module}: package oreline.{top} has no layer; add it to LAYERS in {__file__}")


def import_graph() -> dict[str, set[str]]:
    """module → the oreline modules it imports (relative imports resolved, lazy imports included)."""
    modules = {module_name(p): p for p in (SRC / "oreline").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base_name = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_name = node.module or ""
                names = [base_name]
                # `from oreline.train import dist` imports the module oreline.train.dist
                names += [f"{base_name}.{a.name}" for a in node.names if f"{base_name}.{a.name}" in modules]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("oreline") and name in modules and name != mod:
                    targets.add(name)
        graph[mod] = targets
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in sorted(graph.items()):
        for target in sorted(targets):
            src_group, dst_group = group(mod), group(target)
            if src_group == dst_group:
                continue
            if target == "oreline":  # the package's own __init__ is core
                continue
            if LAYERS[dst_group] >= LAYERS[src_group]:
                bad.append(f"{mod} ({src_group}) imports {target} ({dst_group})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_is_read():
    graph = import_graph()
    # a broken reader would pass every check vacuously
    assert len(graph) > 40
    assert "oreline.errors" in graph["oreline.config"]
    assert any(t.startswith("oreline.train") for t in graph["oreline.eval.evaluate"])


def test_no_upward_imports():
    bad = upward_imports(import_graph())
    assert not bad, "imports against the layer order (" + " → ".join(LAYERS) + "):\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" ↔ ".join(c) for c in found)


@pytest.mark.parametrize(
    ("source", "target", "upward"),
    [
        ("oreline.data.pipeline.tasks", "oreline.train.loop", True),
        ("oreline.eval.evaluate", "oreline.train.checkpoint", False),
    ],
)
def test_checker_flags_an_upward_import(source, target, upward):
    """The checker itself: an edge planted in a copy of the graph is (or is not) reported."""
    graph = {k: set(v) for k, v in import_graph().items()}
    graph.setdefault(source, set()).add(target)
    reported = any(
        line.startswith(f"{source} ") and f"imports {target} " in line for line in upward_imports(graph)
    )
    assert reported is upward


# ---------------------------------------------------------------------------------------------
# docs/design.md's "Where is X?" list names files that exist, in every layer

DESIGN = SRC.parent / "docs" / "design.md"
ROOT_FOLDERS = ("scripts/", "tests/", "benchmarks/", "docs/")


def where_is_paths(text: str) -> list[tuple[str, str]]:
    """(question, path) for every backticked path of the "Where is X?" list: a token with a "/" or
    a file suffix; paths are below src/oreline/ unless they start with one of ROOT_FOLDERS."""
    assert "\n## Where is X?\n" in text, "docs/design.md has no 'Where is X?' section"
    section = text.split("\n## Where is X?\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in section.splitlines():
        if not line.startswith("- ") or "→" not in line:
            continue
        question, answer = line[2:].split("→", 1)
        for token in re.findall(r"`([^`]+)`", answer):
            if "/" in token or re.search(r"\.(py|sh|md)$", token):
                found.append((question.strip(), token))
    return found


def resolve(path: str) -> Path:
    return SRC.parent / path if path.startswith(ROOT_FOLDERS) else SRC / "oreline" / path


def test_where_is_list_names_existing_paths():
    entries = where_is_paths(DESIGN.read_text(encoding="utf-8"))
    assert len(entries) >= 30  # a broken parser would pass the checks below vacuously
    missing = [f"{q} → {p}" for q, p in entries if not resolve(p).exists()]
    assert not missing, "docs/design.md, Where is X?, names paths that do not exist:\n" + "\n".join(missing)


def test_where_is_list_covers_every_layer():
    named = set()
    for _, path in where_is_paths(DESIGN.read_text(encoding="utf-8")):
        if path.startswith(ROOT_FOLDERS):
            continue
        file = resolve(path) / "__init__.py" if path.endswith("/") else resolve(path)
        named.add(group(module_name(file)))
    absent = sorted(set(LAYERS) - named - {"__main__"})
    assert not absent, f"docs/design.md, Where is X?, has no entry for the layers {absent}"


def test_where_is_check_flags_a_missing_path():
    """The check itself: a planted entry naming a file that does not exist is reported."""
    planted = "intro\n## Where is X?\n\n- a thing → `train/no_such_module.py`, `scripts/demo.sh`\n\n## Next\n"
    entries = where_is_paths(planted)
    assert entries == [("a thing", "train/no_such_module.py"), ("a thing", "scripts/demo.sh")]
    assert [p for _, p in entries if not resolve(p).exists()] == ["train/no_such_module.py"]
