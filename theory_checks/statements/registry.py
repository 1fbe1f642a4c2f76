"""The registry of Werner et al.'s statements and how a check is run.

A :class:`Statement` names the claim, where the paper makes it, what kind of claim it
is, and a checker ``check(budget, seed) -> CheckResult``.  ``budget`` says how hard to
look (``"quick"``: the report's ``--quick`` mode, about 8 minutes for all statements
with one torch thread; ``"full"``: about 90); ``seed`` picks the random instances (seed 0 is the
report's default; :func:`statement_seed` derives a check's own streams from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from theory_checks.controls import finalised
from theory_checks.types import CheckResult

Kind = Literal["exact", "up_to_constant", "false_as_printed", "corrected"]
Budget = Literal["quick", "full"]
Check = Callable[[Budget, int], CheckResult]
#: Seeds of one check's streams at seed s: ``base + SEED_STRIDE * s``.
SEED_STRIDE = 1000


def statement_seed(base: int, seed: int) -> int:
    """The seed of a check's stream ``base`` (its own constant, below
    :data:`SEED_STRIDE`) at the run's ``seed``: seed 0 gives ``base`` itself."""
    return base + SEED_STRIDE * seed


@dataclass(frozen=True)
class Statement:
    """One checkable claim.

    Attributes:
        name: registry key (``"lemma1-max"``).
        source: where the paper states it (``"Lemma 1, eq. (19)"``).
        claim: the claim in one line, as the paper states it (or as corrected).
        kind: ``exact`` (must hold on every instance), ``up_to_constant`` (a bound with
            a hidden constant: fit it and the scaling exponents), ``false_as_printed``
            (the check must find a counterexample) or ``corrected`` (our fix of a false
            statement; must hold).
        check: runs the check within ``budget`` on the instances of ``seed``; its
            result's status is already decided by its negative control
            (:func:`theory_checks.controls.finalised`).
        provenance: for a false statement, the step of the paper's proof where it
            goes wrong and what holds instead.
    """

    name: str
    source: str
    claim: str
    kind: Kind
    check: Check
    provenance: str = ""


STATEMENTS: dict[str, Statement] = {}


def register(name: str, source: str, claim: str, kind: Kind, provenance: str = "") -> Callable[[Check], Check]:
    """Decorator: ``@register("lemma7", "Lemma 7, eq. (124)", "...", "exact")`` on a
    ``check(budget, seed) -> CheckResult`` adds it to :data:`STATEMENTS`, with the
    result's status decided by its negative control (:func:`theory_checks.controls.finalised`:
    a "holds" without a violated control is reported ``vacuous``).  The decorated
    function itself is returned unchanged."""
    if kind == "false_as_printed" and not provenance:
        raise ValueError(f"statement {name!r} is false as printed: say where the proof goes wrong (provenance)")

    def add(check: Check) -> Check:
        if name in STATEMENTS:
            raise ValueError(f"statement {name!r} is registered twice")
        def decided(budget: Budget, seed: int = 0) -> CheckResult:
            return finalised(check(budget, seed))

        decided.__doc__ = check.__doc__
        STATEMENTS[name] = Statement(name, source, claim, kind, decided, provenance)
        return check

    return add


def run_checks(budget: Budget = "quick", names: list[str] | None = None, seed: int = 0) -> dict[str, CheckResult]:
    """Run the named checks (all registered ones by default), in registry order, on
    the instances of ``seed``."""
    chosen = list(STATEMENTS) if names is None else names
    unknown = [name for name in chosen if name not in STATEMENTS]
    if unknown:
        raise ValueError(f"unknown statements {unknown}; registered: {sorted(STATEMENTS)}")
    return {name: STATEMENTS[name].check(budget, seed) for name in chosen}
