"""The dependency direction of docs/design.md's "Layout", checked on the imports:
``attacks`` and ``defenses`` import only the core and never each other, the core
imports neither at module level, and ``defenses`` reads in floors (primitives,
threshold clustering, aggregators, algorithms), each module importing only from its
own floor or those below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: docs/design.md's floors of ``defenses``; algorithm modules are every other one.
FLOORS = {
    "primitives": 1, "row_reads": 1, "ball_membership": 1, "radius": 1, "graph_rounds": 1, "optimiser": 1,
    "threshold_clustering": 2, "pairwise_clustering": 2, "kmeans_init": 2,
    "robust_aggregators": 3, "preaggregators": 3, "filtering_aggregators": 3, "byzfl_aggregators": 3,
}
ALGORITHMS = 4


def module_imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Absolute module names ``path`` imports (at module level only, if asked)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def package_of(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("package,forbidden", [("attacks", "defenses"), ("defenses", "attacks"),
                                               ("defenses", "theory_checks"), ("attacks", "theory_checks")])
def test_a_package_never_imports_the_one_it_must_not(package, forbidden):
    offenders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / package).rglob("*.py"))
                 if any(package_of(name) == forbidden for name in module_imports(path))]
    assert not offenders, f"{package} must not import {forbidden}: {offenders}"


def test_the_core_does_not_import_attacks_or_defenses_at_module_level_outside_the_composition_root():
    root = {"experiments", "cli", "api", "catalog", "grid", "backends", "ray_backend", "plugins", "recipes"}
    offenders = []
    for path in sorted((ROOT / "robust_pfl").rglob("*.py")):
        parts = path.relative_to(ROOT / "robust_pfl").with_suffix("").parts
        if parts[0] in root:
            continue
        imported = {package_of(name) for name in module_imports(path, top_level_only=True)}
        if imported & {"attacks", "defenses"}:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"core modules importing attacks/defenses: {offenders}"


def floor(stem: str) -> int:
    return FLOORS.get(stem, ALGORITHMS)


# the package's front (__init__) and its public checks (conformance) see every floor
LAYERED = [path for path in sorted((ROOT / "defenses").glob("*.py")) if path.stem not in ("__init__", "conformance")]


@pytest.mark.parametrize("path", LAYERED, ids=lambda path: path.stem)
def test_a_defenses_module_imports_only_its_floor_or_below(path):
    above = sorted(name for name in module_imports(path)
                   if name.startswith("defenses.") and floor(name.split(".")[1]) > floor(path.stem))
    assert not above, f"defenses.{path.stem} (floor {floor(path.stem)}) imports from a higher floor: {above}"
