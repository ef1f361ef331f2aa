"""The house's layering, read from the code's own imports (every import statement, type-only ones included).

Data flows one way: ``proxy`` is the glue above everything; ``config`` reads ``quotas`` and ``protocol``;
``protocol`` may read the quota catalogue (pure data); ``quotas`` and ``mute`` read nothing of the project but
themselves; ``spark_analysis`` reads ``quotas`` only (its executors run on a Spark cluster without the proxy).
And no module imports itself back through a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "protocol", "quotas", "mute", "config", "spark_analysis")
MAY_IMPORT = {
    "proxy": {"proxy", "protocol", "quotas", "mute", "config"},
    "config": {"config", "quotas", "protocol"},
    "protocol": {"protocol", "quotas"},
    "quotas": {"quotas"},
    "mute": {"mute"},
    "spark_analysis": {"spark_analysis", "quotas"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports (``from pkg import mod`` resolved to the module when it is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def test_every_layer_imports_only_what_it_may():
    wrong = [f"{m} imports {d}" for m, deps in _graph().items() for d in sorted(deps)
             if d.split(".")[0] not in MAY_IMPORT[m.split(".")[0]]]
    assert wrong == []


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if d in graph and d.rpartition(".")[0] == m:
                continue  # a package's __init__ re-exporting its own module is no circle
            if state.get(d) == 1:
                circles.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_the_check_sees_imports_at_all():
    graph = _graph()
    assert "proxy.verdicts" in graph["proxy.policy"] and "quotas.kinds" in graph["spark_analysis.job"]
