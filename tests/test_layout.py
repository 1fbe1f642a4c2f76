"""The import floors of docs/design.md's "Layout", checked on every module's imports
(function-level imports included):

* ``robust_pfl.engine`` is the floor: its modules import only each other;
* ``attacks`` and ``defenses`` import from ``robust_pfl`` only through the engine, and
  never each other; ``theory_checks`` imports neither the composition root nor is
  imported by the engine;
* everything the attacks and defenses reach inside ``robust_pfl`` reaches nothing in
  ``attacks``, ``defenses`` or ``theory_checks``;
* no import cycle between modules, and no module imports another module's
  ``_private`` name;
* ``defenses`` reads in floors (primitives, threshold clustering, aggregators,
  algorithms), each module importing only from its own floor or those below.

Each rule is a function of a source tree, so a planted violation in a scratch tree
shows the rule failing (the ``planted`` tests)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("robust_pfl", "attacks", "defenses", "theory_checks")
ENGINE = "robust_pfl.engine"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the four packages under ``root``, by dotted name."""
    return {module_name(root, path): path for package in PACKAGES if (root / package).is_dir()
            for path in sorted((root / package).rglob("*.py"))}


def imported_names(module: str, path: Path, known: Iterable[str]) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every import in ``path``, at any depth (``name``: the
    imported name of a ``from`` import whose target is not itself a module, else
    None); relative imports resolved, names of our packages resolved to modules."""
    known = set(known)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full, None) if full in known else (base, alias.name))
    return found


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """The module graph of our packages (an import of ``a.b.c`` where only ``a.b`` is a
    module counts as ``a.b``), and every ``(importer, module, _name)`` private import."""
    found = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in found}
    private = []
    for name, path in found.items():
        for target, imported in imported_names(name, path, found):
            if target.split(".")[0] not in PACKAGES:
                continue
            while target not in found and "." in target:
                target = target.rpartition(".")[0]
            if target in found and target != name:
                graph[name].add(target)
                if imported and imported.startswith("_") and not imported.startswith("__"):
                    private.append((name, target, imported))
    return graph, private


def package_of(module: str) -> str:
    return module.split(".")[0]


def in_engine(module: str) -> bool:
    return module == ENGINE or module.startswith(ENGINE + ".")


def reached(graph: dict[str, set[str]], start: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(start)
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph.get(module, ()))
    return seen


def floor_violations(root: Path) -> list[str]:
    """Every breach of the package floors in the tree under ``root``, as text."""
    graph, _ = import_graph(root)
    problems = []
    for module, targets in graph.items():
        for target in sorted(targets):
            if in_engine(module) and not in_engine(target):
                problems.append(f"engine module {module} imports {target}")
            if package_of(module) in ("attacks", "defenses"):
                if package_of(target) == "robust_pfl" and not in_engine(target):
                    problems.append(f"{module} imports {target}, outside {ENGINE}")
                if {package_of(module), package_of(target)} == {"attacks", "defenses"}:
                    problems.append(f"{module} imports {target}: attacks and defenses never import each other")
                if package_of(target) == "theory_checks":
                    problems.append(f"{module} imports {target}, above it")
            if package_of(module) == "theory_checks" and package_of(target) == "robust_pfl" and not in_engine(target):
                problems.append(f"{module} imports {target}: theory_checks sees the engine, not the composition root")
    floor = [target for module, targets in graph.items() if package_of(module) in ("attacks", "defenses")
             for target in targets if package_of(target) == "robust_pfl"]
    for module in sorted(reached(graph, floor)):
        above = sorted(t for t in graph[module] if package_of(t) in ("attacks", "defenses", "theory_checks"))
        if above:
            problems.append(f"{module}, reached from attacks/defenses, imports {above}")
    return problems


def import_cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    graph, _ = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def private_imports(root: Path) -> list[tuple[str, str, str]]:
    return import_graph(root)[1]


def test_the_package_floors_hold():
    assert floor_violations(ROOT) == []


def test_no_two_modules_import_each_other_even_through_others():
    assert import_cycles(ROOT) == []


def test_no_module_imports_another_modules_private_name():
    assert private_imports(ROOT) == []


def test_the_engine_is_what_attacks_and_defenses_reach():
    """The floor is not empty: attacks and defenses do reach the engine, and it is
    closed under imports."""
    graph, _ = import_graph(ROOT)
    floor = {t for m, ts in graph.items() if package_of(m) in ("attacks", "defenses") for t in ts
             if package_of(t) == "robust_pfl"}
    assert {f"{ENGINE}.types", f"{ENGINE}.federation"} <= floor
    assert all(in_engine(module) for module in reached(graph, floor))


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "robust_pfl/__init__.py": "",
    "robust_pfl/engine/__init__.py": "",
    "robust_pfl/engine/types.py": "import torch\n",
    "robust_pfl/cli.py": "import attacks\nimport defenses\nfrom robust_pfl.engine import types\n",
    "attacks/__init__.py": "from robust_pfl.engine.types import x\n",
    "defenses/__init__.py": "from robust_pfl.engine import types\n",
    "theory_checks/__init__.py": "import defenses\n",
}


def test_planted_a_clean_tree_passes(tmp_path):
    root = plant(tmp_path, CLEAN)
    assert floor_violations(root) == [] and import_cycles(root) == [] and private_imports(root) == []


@pytest.mark.parametrize("where,text,expected", [
    ("robust_pfl/engine/types.py", "def late():\n    from defenses import thing\n", "engine module robust_pfl.engine.types imports defenses"),
    ("robust_pfl/engine/types.py", "def late():\n    import robust_pfl.cli\n", "engine module robust_pfl.engine.types imports robust_pfl.cli"),
    ("attacks/__init__.py", "from robust_pfl import cli\n", "attacks imports robust_pfl.cli, outside robust_pfl.engine"),
    ("defenses/__init__.py", "def f():\n    import attacks\n", "defenses imports attacks: attacks and defenses never import each other"),
    ("theory_checks/__init__.py", "from robust_pfl.cli import main\n", "theory_checks imports robust_pfl.cli: theory_checks sees"),
], ids=["engine-up-to-defenses", "engine-up-to-root", "attack-into-root", "defense-into-attacks", "theory-into-root"])
def test_planted_an_upward_import_is_named(tmp_path, where, text, expected):
    root = plant(tmp_path, {**CLEAN, where: text})
    assert any(problem.startswith(expected) for problem in floor_violations(root)), floor_violations(root)


def test_planted_a_cycle_through_a_third_module_is_found(tmp_path):
    root = plant(tmp_path, {**CLEAN, "defenses/a.py": "from defenses import b\n",
                            "defenses/b.py": "def f():\n    from defenses.c import g\n",
                            "defenses/c.py": "from defenses.a import h\n"})
    assert import_cycles(root) == [["defenses.a", "defenses.b", "defenses.c"]]


def test_planted_a_private_import_is_found(tmp_path):
    root = plant(tmp_path, {**CLEAN, "defenses/a.py": "def _helper(): pass\n",
                            "defenses/b.py": "from defenses.a import _helper\nfrom .a import __doc__\n"})
    assert private_imports(root) == [("defenses.b", "defenses.a", "_helper")]


#: docs/design.md's floors of ``defenses`` (by module, or by subpackage for the
#: aggregators); algorithm modules are every other one.
FLOORS = {
    "primitives": 1, "row_reads": 1, "ball_membership": 1, "radius": 1, "graph_rounds": 1, "optimiser": 1,
    "threshold_clustering": 2, "pairwise_clustering": 2, "kmeans_init": 2,
    "aggregators": 3,
}
ALGORITHMS = 4
#: the package's front (``defenses``) and its public checks (``defenses.conformance``) see every floor
UNLAYERED = {"defenses", "defenses.conformance"}


def floor(module: str) -> int:
    return FLOORS.get(module.split(".")[1], ALGORITHMS)


def layer_violations(root: Path) -> list[str]:
    graph, _ = import_graph(root)
    return [f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
            for module, targets in sorted(graph.items())
            if package_of(module) == "defenses" and module not in UNLAYERED
            for target in sorted(targets)
            if package_of(target) == "defenses" and target not in UNLAYERED and floor(target) > floor(module)]


def test_a_defenses_module_imports_only_its_floor_or_below():
    assert layer_violations(ROOT) == []


def test_planted_a_primitive_importing_an_aggregator_is_named(tmp_path):
    root = plant(tmp_path, {**CLEAN, "defenses/primitives.py": "def f():\n    from defenses.aggregators import base\n",
                            "defenses/aggregators/__init__.py": "", "defenses/aggregators/base.py": ""})
    assert layer_violations(root) == ["defenses.primitives (floor 1) imports defenses.aggregators.base (floor 3)"]
