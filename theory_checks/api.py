"""Checking a statement from a notebook or a script: one registered statement of
Werner et al. (:func:`check`), or a bound of your own on random instances with the
package's search and shrink (:func:`check_bound`) and a rate of your own with its
verdict (:func:`check_rate`).  ``theory_checks`` re-exports all three.

A bound of your own::

    import numpy as np
    from theory_checks import check_bound

    def pairs(rng, size):  # a batch of instances: arrays with a leading batch axis
        return {"a": rng.uniform(0, 4, size), "b": rng.uniform(0, 4, size)}

    result = check_bound(lambda x: np.sqrt(x["a"] * x["b"]),      # lhs
                         lambda x: (x["a"] + x["b"]) / 2, pairs)  # rhs: AM-GM holds
    result.status        # "holds"; result.worst_slack: the smallest relative margin

    result = check_bound(lambda x: x["a"] ** 2, lambda x: 2 * x["a"], pairs, name="a^2 <= 2a")
    result.status, result.counterexample   # "fails", the simplest violating instance found
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from theory_checks.fitting import fit_mean_power_law
from theory_checks.statements import STATEMENTS, Budget
from theory_checks.statements.search import (
    TOLERANCE,
    Candidates,
    Instance,
    Sampler,
    batched,
    instance_at,
    plain,
    rounded_arrays,
    shrink,
    simpler_entries,
)
from theory_checks.types import CheckResult, Hypothesis
from theory_checks.verdicts import rate_status, rate_verdict

Side = Callable[[Instance], np.ndarray]


def check(statement: str, budget: Budget = "quick", seed: int = 0) -> CheckResult:
    """Run one registered statement's check (``theory_checks.statements.STATEMENTS``)
    within ``budget`` on the instances of ``seed``.

    Raises:
        ValueError: naming the registered statements, for an unknown name.
    """
    if statement not in STATEMENTS:
        raise ValueError(f"unknown statement {statement!r}; registered: {sorted(STATEMENTS)}")
    return STATEMENTS[statement].check(budget, seed)


def relative_margin(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``(rhs - lhs) / max(|lhs|, |rhs|)``: below 0 where ``lhs <= rhs`` fails, on the
    scale of the two sides (0 where both are 0; NaN sides give NaN, a violation)."""
    lhs, rhs = np.asarray(lhs, float), np.asarray(rhs, float)
    scale = np.maximum(np.abs(lhs), np.abs(rhs))
    with np.errstate(invalid="ignore", divide="ignore"):
        margin = np.where(scale > 0, (rhs - lhs) / np.where(scale > 0, scale, 1.0), 0.0)
    return np.where(np.isnan(lhs) | np.isnan(rhs), -np.inf, margin)


def _default_candidates(instance: Instance) -> Candidates:
    keys = list(instance)

    def candidates(current: Instance):
        yield from rounded_arrays(current, keys)
        yield from simpler_entries(current, keys)

    return candidates


def check_bound(
    lhs: Side,
    rhs: Side,
    sampler: Sampler,
    *,
    name: str = "bound",
    instances: int = 10_000,
    batch_size: int = 1_000,
    seed: int = 0,
    valid: Callable[[Instance], bool] | None = None,
    candidates: Candidates | None = None,
    tolerance: float = TOLERANCE,
) -> CheckResult:
    """Check ``lhs(instance) <= rhs(instance)`` on ``instances`` random instances.

    ``sampler(rng, size)`` returns a batch: a dict of numpy arrays with a leading axis
    of ``size`` instances; ``lhs`` and ``rhs`` map a batch to one value per instance.
    A relative margin (:func:`relative_margin`) below ``-tolerance`` is a violation.
    No violation: ``holds``, with the smallest margin in ``worst_slack``.  Else
    ``fails``: the first violating instance is shrunk (every array rounded as a whole,
    then each entry tried at simpler values, or ``candidates``; a candidate is kept
    when ``valid`` accepts it, it is simpler and still violates) and returned as the
    counterexample with both sides evaluated on it.  The sampler's own instances are
    taken as valid: ``valid`` keeps the shrink inside the domain they come from.
    """
    if instances < 1 or batch_size < 1:
        raise ValueError(f"instances and batch_size must be >= 1, got {instances} and {batch_size}")

    def margin(batch: Instance) -> np.ndarray:
        return relative_margin(lhs(batch), rhs(batch))

    rng = np.random.default_rng(seed)
    tried = violations = 0
    worst = np.inf
    found: Instance | None = None
    while tried < instances:
        batch = sampler(rng, min(batch_size, instances - tried))
        margins = np.asarray(margin(batch), float).ravel()
        bad = np.flatnonzero(margins < -tolerance)
        tried += margins.size
        violations += bad.size
        worst = min(worst, float(margins.min()))
        if found is None and bad.size:
            found = instance_at(batch, int(bad[0]))
    if found is None:
        return CheckResult(name, "holds", instances=tried, worst_slack=worst,
                           evidence=f"{tried} instances, smallest relative margin {worst:.3g}")

    def violates(candidate: Instance) -> bool:
        return float(margin(batched(candidate))[0]) < -tolerance

    shrunk, steps = shrink(found, violates, candidates or _default_candidates(found), valid)
    one = batched(shrunk)
    counterexample = {**plain(shrunk), "lhs": float(np.asarray(lhs(one)).ravel()[0]),
                      "rhs": float(np.asarray(rhs(one)).ravel()[0])}
    return CheckResult(name, "fails", instances=tried, worst_slack=worst, counterexample=counterexample,
                       evidence=f"violated on {violations} of {tried} instances; shrunk in {steps} steps",
                       details={"found": plain(found), "shrink_steps": steps})


def check_rate(
    values: Sequence[float],
    errors: np.ndarray,
    claimed: float,
    *,
    name: str = "rate",
    variable: str = "x",
    bounded: bool = False,
    hypotheses: Sequence[Hypothesis] = (),
    seed: int = 0,
) -> CheckResult:
    """The verdict on a rate ``E error <~ C x^claimed`` from measurements
    ``errors[len(values), repeats]``: the exponent of the mean over the repeats with its
    bootstrap interval (:func:`theory_checks.fitting.fit_mean_power_law`), the verdict
    and its direction (:func:`theory_checks.verdicts.rate_verdict`; ``bounded``: the
    variable cannot grow without limit), and the status given the measured
    ``hypotheses`` (``hypotheses_unmet`` when one fails)."""
    law = fit_mean_power_law(values, errors, seed=seed)
    verdict = rate_verdict(law, claimed, bounded)
    status = rate_status({variable: verdict}, hypotheses)
    if status == "holds_with_constant":  # no bound's values were given: the exponent decides alone
        status = "holds"
    evidence = f"{variable}: {law.exponent:+.2f} [{law.low:+.2f}, {law.high:+.2f}] vs claimed {claimed:+.2f} " \
               f"({verdict.verdict}: {verdict.direction})"
    return CheckResult(name, status, instances=len(values), exponents={variable: (law, claimed)},
                       evidence=evidence, hypotheses=tuple(hypotheses), verdicts={variable: verdict})
