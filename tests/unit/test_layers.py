"""The layers point one way (docs/SCHEDULER.md, "The node layer"): node/ imports nothing of tuner/ or
daemon/, and no module of node/, tuner/ or daemon/ takes part in an import circle (imports inside
functions count: a circle that only works because one side imports late is still one concept in two
places). Read from the source text, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "autotune"
LAYERED = ("autotune.node", "autotune.tuner", "autotune.daemon")


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("autotune"))
    return {m for m in out if m in known}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(path, known) for name, path in known.items()}


def test_the_node_layer_imports_nothing_above_it() -> None:
    graph = _graph()
    up = sorted((m, i) for m, imports in graph.items() if m.startswith("autotune.node")
                for i in imports if i.startswith(("autotune.tuner", "autotune.daemon")))
    assert up == []
    assert "autotune.node" in graph and "autotune.node.scheduler" in graph


def test_no_import_circle_through_node_tuner_or_daemon() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:           # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 and any(m.startswith(LAYERED) for m in comp):
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []
