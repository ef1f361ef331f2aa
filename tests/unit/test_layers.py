"""The house's layering, read from the code's own imports (every import statement, type-only ones included).

Data flows one way: ``proxy`` is the glue above everything; ``config`` reads ``quotas`` and ``protocol``;
``protocol`` may read the quota catalogue (pure data); ``quotas`` and ``mute`` read nothing of the project but
themselves; ``spark_analysis`` reads ``quotas`` only (its executors run on a Spark cluster without the proxy).
And no module imports itself back through a circle.

Tests and benchmarks: ``bench`` measures with the tests' helpers, never the other way round. Nothing under
``tests/`` imports ``bench`` (a benchmark may be run as a program, as the instruction guard runs
``bench.live_instructions``); ``bench`` imports only public names of the test-support modules (``tests.support``,
``tests.harness`` and its modules), never a test module's or an underscored name.
"""

from __future__ import annotations

import ast
import importlib
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
    wrong = [
        f"{m} imports {d}"
        for m, deps in _graph().items()
        for d in sorted(deps)
        if d.split(".")[0] not in MAY_IMPORT[m.split(".")[0]]
    ]
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
                circles.append(path[path.index(d) :] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


PROXY_MAY_IMPORT = {
    "proxy.rules": {"proxy.rules", "proxy.stats", "proxy.decision_log", "proxy.fleet.parts", "proxy.wire.responses"},
    "proxy.wire": {"proxy.wire", "proxy.rules", "proxy.stats"},
    "proxy.fleet": {"proxy.fleet"},
    "proxy.decision_log": {"proxy.decision_log"},
    "proxy.stats": set(),
    "proxy.build_info": set(),
    "proxy.metrics": {"proxy.stats", "proxy.wire.loop_lag"},
}
"""Inside ``proxy/``, a package's modules may import these (a name stands for the package or module and what is
under it): the rules decide without the wire, but for the topic-id table the responses learn
(``proxy.wire.responses.TopicIds``), and are built with the fleet's parts, never its sync; they write the decision
log; the wire asks the rules;
the fleet's sync, the decision log and the counters import none of the others. The server and the CLI, above
them all, are not listed: they compose the rest."""


def _within(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def test_the_proxy_packages_import_one_way():
    wrong = []
    for m, deps in _graph().items():
        rule = next((k for k in PROXY_MAY_IMPORT if m == k or m.startswith(k + ".")), None)
        if rule is None:
            continue
        wrong += [
            f"{m} imports {d}" for d in sorted(deps) if d.startswith("proxy") and not _within(d, PROXY_MAY_IMPORT[rule])
        ]
    assert wrong == []


def test_the_proxy_packages_rule_can_fail():
    graph = _graph()
    assert "proxy.rules.policy" in graph["proxy.wire.connection"]  # the wire asks the rules: allowed one way
    assert not _within("proxy.wire.connection", PROXY_MAY_IMPORT["proxy.rules"])


def test_the_check_sees_imports_at_all():
    graph = _graph()
    assert "proxy.rules.verdicts" in graph["proxy.rules.policy"] and "quotas.kinds" in graph["spark_analysis.job"]


TEST_SUPPORT = ("tests.support", "tests.harness")
"""The modules bench may import from tests (``tests.harness`` with its submodules)."""


def _absolute_imports(source: str, filename: str) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for each absolute import statement; ``import a.b`` gives (a.b, [])."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
    return out


def _bench_imports_in(source: str, filename: str) -> list[str]:
    return [
        f"{filename} imports {module}"
        for module, _ in _absolute_imports(source, filename)
        if module == "bench" or module.startswith("bench.")
    ]


def _wrong_test_imports_in(source: str, filename: str) -> list[str]:
    """What a bench file imports from tests that is not a public name of a test-support module."""
    wrong = []
    for module, names in _absolute_imports(source, filename):
        if module != "tests" and not module.startswith("tests."):
            continue
        parts = module.split(".")
        if not any(module == m or module.startswith(m + ".") for m in TEST_SUPPORT) or len(parts) > 3:
            wrong.append(f"{filename} imports {module}: not a test-support module")
        elif any(p.startswith("_") for p in parts):
            wrong.append(f"{filename} imports {module}: a private module")
        wrong += [f"{filename} imports {module}.{n}: a private name" for n in names if n.startswith("_")]
    return wrong


def test_tests_import_nothing_from_bench():
    wrong = [
        w
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for w in _bench_imports_in(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert wrong == []


def test_bench_imports_only_public_helpers_of_the_test_support_modules():
    wrong, used = [], []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        source, name = path.read_text(), str(path.relative_to(ROOT))
        wrong += _wrong_test_imports_in(source, name)
        used += [(name, m, n) for m, names in _absolute_imports(source, name) if m.startswith("tests.") for n in names]
    assert wrong == []
    # ... and each name is there: renaming a helper must not leave a benchmark that fails only when someone runs it.
    missing = [f"{f} imports {m}.{n}" for f, m, n in used if not hasattr(importlib.import_module(m), n)]
    assert missing == []
    assert ("bench/quota_fidelity.py", "tests.harness.measure", "steady_rate") in used


def test_the_test_and_bench_checks_see_what_they_forbid():
    assert _bench_imports_in("from bench.quota_fidelity import MIB\nimport bench.run\n", "t.py") == [
        "t.py imports bench.quota_fidelity",
        "t.py imports bench.run",
    ]
    assert _wrong_test_imports_in(
        "from tests.unit.test_hostile_input import BODIES\nfrom tests.support import _private\n"
        "from tests.harness._inner import x\nfrom tests.harness.measure import MIB\nimport os\n",
        "b.py",
    ) == [
        "b.py imports tests.unit.test_hostile_input: not a test-support module",
        "b.py imports tests.support._private: a private name",
        "b.py imports tests.harness._inner: a private module",
    ]


WIRED_AT_START = frozenset({"store", "on_alter", "ledger"})
"""Attributes that wire the fleet into the quota path: given to their owner's constructor (``proxy.fleet.parts``),
never set on another object after it is built (issue 49)."""


def _foreign_wiring(tree: ast.AST) -> list[str]:
    """``x.store = …`` and the like where ``x`` is not ``self``: one object patching another's wiring."""
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            own = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            if isinstance(t, ast.Attribute) and t.attr in WIRED_AT_START and not own:
                found.append(f"{ast.unparse(t)} (line {t.lineno})")
    return found


def test_nothing_in_the_proxy_wires_another_objects_store_ledger_or_alter_hook():
    bad = {
        name: hits
        for name, path in _modules().items()
        if (hits := _foreign_wiring(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert bad == {}


def test_the_wiring_check_sees_a_patch():
    assert _foreign_wiring(ast.parse("manager.store = LeasedStore(s, h, c)\nself.store = s")) == [
        "manager.store (line 1)"
    ]


DECISION_BUILDERS = frozenset({"proxy.rules.decisions", "proxy.rules.policy"})
"""Where a :class:`proxy.rules.decisions.Decision`'s fields are assigned: its own module (its methods, which the rules
that charge after the policy's step call) and the policy that builds it. A rule reports; it does not fill fields in."""


def _assigned_attributes(tree: ast.AST) -> list[ast.Attribute]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute):
                out.append(t)
    return out


def _decision_only_fields(modules: dict[str, Path]) -> set[str]:
    """Decision's slots that no other class of the project has a field of the same name (a name shared with
    another class, ``state`` say, cannot be told apart without types)."""
    tree = ast.parse(modules["proxy.rules.decisions"].read_text(encoding="utf-8"))
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Decision")
    slots_node = next(
        n.value for n in cls.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__slots__"
    )
    slots = set(ast.literal_eval(slots_node))
    shared: set[str] = set()
    for path in modules.values():
        for c in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(c, ast.ClassDef) and c.name != "Decision":
                for t in _assigned_attributes(c):
                    if isinstance(t.value, ast.Name) and t.value.id == "self":
                        shared.add(t.attr)
    return slots - shared


def _decision_writes(tree: ast.AST, fields: set[str]) -> list[str]:
    return [f"{ast.unparse(t)} (line {t.lineno})" for t in _assigned_attributes(tree) if t.attr in fields]


def test_only_the_policy_and_the_decision_itself_fill_in_a_decision():
    modules = _modules()
    fields = _decision_only_fields(modules)
    assert {"pace_marks", "new_pids", "rejected", "charged_ms", "holds"} <= fields  # it still sees the rules' fields
    bad = {
        name: hits
        for name, path in modules.items()
        if name not in DECISION_BUILDERS
        if (hits := _decision_writes(ast.parse(path.read_text(encoding="utf-8")), fields))
    }
    assert bad == {}


def test_the_decision_check_sees_a_rule_filling_a_field():
    tree = ast.parse("d.new_pids = 3\nd.noted |= 4\nd.later, x = (), 1\nself.y = 2")
    assert _decision_writes(tree, {"new_pids", "noted", "later"}) == [
        "d.new_pids (line 1)",
        "d.noted (line 2)",
        "d.later (line 3)",
    ]
