"""Counterexample search for the statement checks: a seeded random search over
instances, then a greedy shrink to the simplest instance that still violates the
claim; and the verdict of an exact claim from its margins.

An *instance* is a dict of numpy arrays.  Batches of instances carry a leading batch
axis on every array; a claim's ``margin(batch) -> [B]`` is normalised so that a value
below ``-tolerance`` is a violation (rounding stays far inside the tolerance).

Shrinking keeps a candidate only if it is valid, still violates the claim, and is
strictly simpler by :func:`simplicity` (fewer numbers first, then shorter decimal
writings), so it never cycles (and stops after ``max_steps`` in any case).  Everything is deterministic given the seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from theory_checks.types import CheckResult, NegativeControl

Instance = dict[str, np.ndarray]
Margin = Callable[[Instance], np.ndarray]
Candidates = Callable[[Instance], Iterable[Instance]]
Sampler = Callable[[np.random.Generator, int], Instance]

# Relative margins below this are violations; rounding of the float64 evaluations
# used here stays below 1e-12.
TOLERANCE = 1e-9

# Decimal places tried when writing a number or rounding it.
_MAX_DECIMALS = 6


def batched(instance: Instance) -> Instance:
    """The instance as a batch of one."""
    return {key: np.asarray(value)[None] for key, value in instance.items()}


def instance_at(batch: Instance, index: int) -> Instance:
    """Instance ``index`` of a batch."""
    return {key: np.asarray(value)[index].copy() for key, value in batch.items()}


def margin_of(margin: Margin, instance: Instance) -> float:
    """The margin of one (unbatched) instance."""
    return float(np.asarray(margin(batched(instance)))[0])


def number_cost(value: float) -> float:
    """How complicated ``value`` is to write: the characters of its shortest decimal
    writing with at most six decimals (``0`` costs 1, ``-1`` 2, ``0.5`` 3), plus
    ``|v| / (1 + |v|) < 1`` so that among writings of one length the smaller magnitude
    is simpler (1 before 2).  Numbers that need more decimals cost the length of their
    12-digit writing plus one, so any rounding makes them cheaper."""
    value = float(value)
    if not np.isfinite(value):
        return 64.0
    size = abs(value) / (1.0 + abs(value))
    if value == 0:
        return 1.0
    for decimals in range(_MAX_DECIMALS + 1):
        if abs(round(value, decimals) - value) <= 1e-12 * max(1.0, abs(value)):
            return len(f"{value:.{decimals}f}") + size
    return len(f"{value:.12g}") + 1 + size


def simplicity(instance: Instance) -> tuple[int, float]:
    """``(how many numbers, total decimal cost)``: smaller is simpler (compared
    lexicographically)."""
    entries = sum(int(np.asarray(value).size) for value in instance.values())
    cost = sum(number_cost(v) for value in instance.values() for v in np.asarray(value, float).ravel())
    return entries, cost


def simpler_values(value: float) -> list[float]:
    """Simpler numbers to try in place of ``value``, simplest first: 0, +-1, the
    nearest integer, 2 with ``value``'s sign, then ``value`` rounded to 1, 2, 3
    decimals (``value`` itself and repeats left out)."""
    options = [0.0, 1.0, -1.0, float(np.round(value)), float(np.sign(value)) * 2.0]
    options += [round(value, decimals) for decimals in (1, 2, 3)]
    seen: list[float] = []
    for option in options:
        if option != value and option not in seen:
            seen.append(option)
    return seen


def with_value(instance: Instance, key: str, value: np.ndarray) -> Instance:
    """A copy of ``instance`` with ``instance[key] = value``."""
    changed = dict(instance)
    changed[key] = np.asarray(value, dtype=np.asarray(instance[key]).dtype)
    return changed


def rounded_arrays(instance: Instance, keys: Iterable[str]) -> Iterator[Instance]:
    """Each array of ``keys`` rounded as a whole to 0..3 decimals (keeps symmetry)."""
    for key in keys:
        array = np.asarray(instance[key], float)
        for decimals in range(4):
            candidate = np.round(array, decimals)
            if not np.array_equal(candidate, array):
                yield with_value(instance, key, candidate)


def simpler_entries(instance: Instance, keys: Iterable[str]) -> Iterator[Instance]:
    """Each entry of the arrays ``keys`` replaced by each of its :func:`simpler_values`."""
    for key in keys:
        array = np.asarray(instance[key], float)
        for position in np.ndindex(array.shape):
            for option in simpler_values(float(array[position])):
                candidate = array.copy()
                candidate[position] = option
                yield with_value(instance, key, candidate)


def shrink(
    instance: Instance,
    violates: Callable[[Instance], bool],
    candidates: Candidates,
    valid: Callable[[Instance], bool] | None = None,
    max_steps: int = 400,
) -> tuple[Instance, int]:
    """Greedy shrink: repeatedly take the first candidate that is valid, strictly
    simpler and still violating, until none is.  Returns the instance and the number
    of accepted steps."""
    current, cost, steps = instance, simplicity(instance), 0
    while steps < max_steps:
        for candidate in candidates(current):
            candidate_cost = simplicity(candidate)
            if candidate_cost >= cost or (valid is not None and not valid(candidate)):
                continue
            if violates(candidate):
                current, cost, steps = candidate, candidate_cost, steps + 1
                break
        else:
            return current, steps
    return current, steps


@dataclass(frozen=True)
class SearchOutcome:
    """What :func:`search_then_shrink` found.

    ``tried`` random instances, ``violations`` of them violated the claim; ``found``
    is the first violating one and ``shrunk`` its shrunk form (``None`` when none
    violated); ``margin`` is the shrunk instance's margin."""

    tried: int
    violations: int
    found: Instance | None = None
    shrunk: Instance | None = None
    margin: float | None = None
    shrink_steps: int = 0

    @property
    def rate(self) -> float:
        return self.violations / self.tried if self.tried else float("nan")


def search_then_shrink(
    sample: Sampler,
    margin: Margin,
    candidates: Candidates,
    *,
    seed: int,
    batches: int,
    batch_size: int,
    valid: Callable[[Instance], bool] | None = None,
    tolerance: float = TOLERANCE,
) -> SearchOutcome:
    """Draw ``batches`` batches of ``batch_size`` instances from ``sample(rng, size)``
    (``rng`` seeded with ``seed``), count the violations (``margin < -tolerance``),
    and shrink the first violating instance."""
    rng = np.random.default_rng(seed)
    tried = violations = 0
    found: Instance | None = None
    for _ in range(batches):
        batch = sample(rng, batch_size)
        margins = np.asarray(margin(batch), float)
        bad = np.flatnonzero(margins < -tolerance)
        tried += margins.size
        violations += bad.size
        if found is None and bad.size:
            found = instance_at(batch, int(bad[0]))
    if found is None:
        return SearchOutcome(tried, violations)

    def violates(candidate: Instance) -> bool:
        return margin_of(margin, candidate) < -tolerance

    shrunk, steps = shrink(found, violates, candidates, valid)
    return SearchOutcome(tried, violations, found, shrunk, margin_of(margin, shrunk), steps)


def plain(instance: Instance) -> dict[str, Any]:
    """The instance as plain Python numbers and nested lists (integers stay integers)."""
    out: dict[str, Any] = {}
    for key, value in instance.items():
        array = np.asarray(value)
        out[key] = array.tolist() if array.ndim else array.item()
    return out


def exact_verdict(
    statement: str,
    margins: np.ndarray,
    describe: Callable[[int], dict[str, Any]] | None = None,
    *,
    tolerance: float = TOLERANCE,
    what: str = "relative margin",
    details: dict[str, Any] | None = None,
    control: NegativeControl | None = None,
) -> CheckResult:
    """The verdict of an exact claim from its margins: ``holds`` with the smallest
    margin seen, or ``fails`` with the most violating instance as the counterexample
    (``describe(index)`` gives its inputs and the claim's two sides).  ``control``
    (:func:`theory_checks.controls.margin_control`) is the claim on instances breaking
    a hypothesis; it is attached with the real instances' smallest margin beside it."""
    margins = np.asarray(margins, float).ravel()
    worst = int(np.argmin(margins))
    if control is not None:
        control = dataclasses.replace(control, real=float(margins[worst]))
    if margins[worst] >= -tolerance:
        evidence = f"{margins.size} instances, smallest {what} {margins[worst]:.3g}"
        if control is not None:
            evidence += f"; control ({control.description}): {control.ratio:.3g}"
        return CheckResult(
            statement,
            "holds",
            instances=int(margins.size),
            worst_slack=float(margins[worst]),
            evidence=evidence,
            details=dict(details or {}),
            negative_control=control,
        )
    counterexample: dict[str, Any] = {"margin": float(margins[worst])}
    if describe is not None:
        counterexample.update(describe(worst))
    violated = int((margins < -tolerance).sum())
    return CheckResult(
        statement,
        "fails",
        instances=int(margins.size),
        worst_slack=float(margins[worst]),
        counterexample=counterexample,
        evidence=f"violated on {violated} of {margins.size} instances ({what} down to {margins[worst]:.3g})",
        details=dict(details or {}),
        negative_control=control,
    )


def described(batch: Instance, sides: Callable[[Instance], tuple[np.ndarray, np.ndarray]] | None = None
              ) -> Callable[[int], dict[str, Any]]:
    """``describe`` for :func:`exact_verdict`: instance ``index`` of ``batch`` as plain
    numbers, with ``lhs`` and ``rhs`` from ``sides`` (evaluated on it alone)."""

    def describe(index: int) -> dict[str, Any]:
        single = instance_at(batch, index)
        out = plain(single)
        if sides is not None:
            lhs, rhs = sides(batched(single))
            out.update(lhs=float(np.asarray(lhs).ravel()[0]), rhs=float(np.asarray(rhs).ravel()[0]))
        return out

    return describe
