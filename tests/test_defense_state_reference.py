"""What each defense publishes to adaptive attacks is declared
(robust_pfl.engine.defense_state), every registered algorithm publishes exactly its
declaration in short runs (options that change its deliveries included), a wrong
declaration is named, and docs/extending.md's "Context and state reference" is the
declarations and the context's fields as they are, its code blocks run as written."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import attacks
import defenses
from defenses.conformance import _options, check_algorithm_published_state
from robust_pfl.engine import defense_state
from robust_pfl.engine.conformance import ConformanceError
from robust_pfl.engine.defense_state import DECLARED, reference_markdown
from robust_pfl.engine.types import AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BUILT_IN = {name: cls for name, cls in defenses.REGISTRY.items() if cls.__module__.startswith("defenses.")}
#: Options that change which kinds of message an algorithm delivers, or their layout.
VARIANTS = [
    ("fc", {"groups": 2}),
    ("cfl", {"local_steps": 2}),
    ("clove", {"aggregation": "gradient"}),
    ("pdl_tc", {"graph": {"kind": "erdos_renyi", "p": 0.5}}),
    ("mc", {"warm_start": False}),
]


def reference_section() -> str:
    text = PAGE.read_text()
    start, end = "<!-- defense-state:begin -->\n", "<!-- defense-state:end -->"
    assert start in text and end in text, "docs/extending.md lost its defense-state markers"
    return text.split(start, 1)[1].split(end, 1)[0]


def test_the_pages_per_defense_tables_are_the_declarations():
    assert reference_section() == reference_markdown(), (
        "docs/extending.md's state reference differs from robust_pfl.engine.defense_state; paste the output of "
        "python -c 'from robust_pfl.engine.defense_state import reference_markdown; print(reference_markdown())'")


def test_the_pages_context_table_lists_every_field_of_the_context():
    section = PAGE.read_text().split("### What an attack is handed", 1)[1].split("###", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert documented == [item.name for item in dataclasses.fields(AttackContext)]


def test_every_built_in_algorithm_names_a_declaration_whose_label_lists_it():
    """Both ways: an algorithm's ``published_state`` is one of ``DECLARED`` and its label
    names the algorithm; every name in a label is a registered algorithm declaring it."""
    for name, cls in BUILT_IN.items():
        assert cls.published_state in DECLARED, name
        assert name in cls.published_state.label.split(", "), (name, cls.published_state.label)
    for declared in DECLARED:
        for name in declared.label.split(", "):
            assert BUILT_IN[name].published_state is declared, name


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_algorithm_publishes_what_it_declares(name):
    cls = BUILT_IN[name]
    check_algorithm_published_state(cls, _options(cls, None), rounds=3)


@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=[name for name, _ in VARIANTS])
def test_options_that_change_the_deliveries_keep_the_declaration(name, options):
    cls = BUILT_IN[name]
    check_algorithm_published_state(cls, _options(cls, options), rounds=3)


def _redeclared(cls: type, key: str, **changes) -> type:
    """``cls`` declaring its own state with ``key`` changed."""
    declared = cls.published_state
    deliveries = tuple(dataclasses.replace(delivery, keys=tuple(
        dataclasses.replace(item, **changes) if item.name == key else item for item in delivery.keys))
        for delivery in declared.deliveries)
    return type(f"Misdeclared{cls.__name__}", (cls,), {"published_state": dataclasses.replace(
        declared, deliveries=deliveries)})


@pytest.mark.parametrize(("name", "key", "changes", "named"), [
    ("fc", "centres", {"shape": ("K", "d")}, r"centres: shape \(6, 1, 5\), declared \[K, d\]"),
    ("mc", "centres", {"none_in_round_0": False}, "momentum round 0: centres is None"),
    ("ifca", "assignment", {"dtype": "bool"}, "assignment: dtype torch.int64, declared bool"),
    ("fedspd", "aggregate", {"shape": ("...", "S", "d")}, r"aggregate: shape \(8, 1, 5\)"),
])
def test_a_declaration_the_run_breaks_is_named(name, key, changes, named):
    cls = _redeclared(BUILT_IN[name], key, **changes)
    with pytest.raises(ConformanceError, match=named):
        check_algorithm_published_state(cls, _options(cls, None))


def test_publishing_a_key_at_a_kind_declared_empty_is_named():
    cls = type("Undeclared", (BUILT_IN["mc"],), {"published_state": defense_state.NOTHING})
    with pytest.raises(ConformanceError, match=r"publishes \['aggregate', 'assignment', 'centres', 'radius_policy'\] at momentum"):
        defenses.check_algorithm(cls)


def test_the_pages_adaptive_attack_blocks_run_as_written():
    """The guarded example passes check_attack (run in the block); the unguarded one
    fails it naming the key and the defense."""
    blocks = re.findall(r"```python reference\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 2
    scope: dict = {}
    for body in blocks:
        exec(compile(body, str(PAGE), "exec"), scope)
    assert scope["message"].startswith("Unguarded: reads defense_state['centres'], which local does not publish")
    attacks.conformance.check_defense_states(scope["ToTheCentre"]())
