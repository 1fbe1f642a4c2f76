"""Checking a statement from a notebook or a script: one registered statement of
Werner et al. (:func:`check`), or a bound of your own on random instances with the
package's search and shrink (:func:`check_bound`) and a rate of your own with its
verdict (:func:`check_rate`).  ``theory_checks`` re-exports all three.

A bound of your own, with its negative control: instances that break one hypothesis of
the bound, chosen so that the bound must fail on them (a check that cannot fail is no
evidence).  A "holds" counts only when the control violates the bound; otherwise, and
without a control, the status is ``vacuous`` (:func:`theory_checks.controls.finalised`)::

    import numpy as np
    from theory_checks import check_bound, check_rate

    def pairs(rng, size):  # a batch of instances: arrays with a leading batch axis
        return {"a": rng.uniform(0, 4, size), "b": rng.uniform(0, 4, size)}

    def negative_pairs(rng, size):  # AM-GM needs a, b >= 0: both negative,
        return {"a": rng.uniform(-4, -0.1, size),  # sqrt(ab) > 0 > (a + b) / 2
                "b": rng.uniform(-4, -0.1, size)}

    result = check_bound(lambda x: np.sqrt(x["a"] * x["b"]),      # lhs
                         lambda x: (x["a"] + x["b"]) / 2, pairs,  # rhs: AM-GM holds
                         control=negative_pairs, control_description="a, b < 0")
    result.status        # "holds"; result.worst_slack: the smallest relative margin
    result.negative_control.violated, result.negative_control.ratio  # True, -2.0 (at a = b)

    result = check_bound(lambda x: x["a"] ** 2, lambda x: 2 * x["a"], pairs, name="a^2 <= 2a")
    result.status, result.counterexample   # "fails", the simplest violating instance found

A rate's control is the error of a broken algorithm measured at the same values (a
frozen model, no clustering): it must *fail* the claimed rate::

    T = np.array([32, 64, 128, 256])
    errors = np.outer(T ** -0.5, [0.9, 1.0, 1.1])  # [levels, repeats]
    frozen = np.ones((4, 3))                        # a model that never learns
    check_rate(T, errors, -0.5, variable="T", control_errors=frozen,
               control_description="a frozen model").status  # "holds"
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from theory_checks.controls import finalised, margin_control, rate_control
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
from theory_checks.types import CheckResult, Hypothesis, NegativeControl
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
    control: Sampler | None = None,
    control_description: str = "instances that break a hypothesis",
    control_instances: int = 1_000,
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

    ``control`` (a sampler like ``sampler``) draws ``control_instances`` instances that
    break one hypothesis of the bound so that it must fail there; their margins, as
    above, make :attr:`CheckResult.negative_control`.  A "holds" whose control is
    missing or not violated is reported ``vacuous``
    (:func:`theory_checks.controls.finalised`).
    """
    if instances < 1 or batch_size < 1:
        raise ValueError(f"instances and batch_size must be >= 1, got {instances} and {batch_size}")

    def margin(batch: Instance) -> np.ndarray:
        return relative_margin(lhs(batch), rhs(batch))

    rng = np.random.default_rng(seed)
    tried = violations = 0
    worst = np.inf
    found: Instance | None = None
    for batch in _batches(sampler, rng, instances, batch_size):
        margins = np.asarray(margin(batch), float).ravel()
        bad = np.flatnonzero(margins < -tolerance)
        tried += margins.size
        violations += bad.size
        worst = min(worst, float(margins.min()))
        if found is None and bad.size:
            found = instance_at(batch, int(bad[0]))
    negative = None if control is None else _bound_control(
        margin, control, control_description, control_instances, batch_size, seed, tolerance, worst)
    if found is None:
        return finalised(CheckResult(name, "holds", instances=tried, worst_slack=worst,
                                     evidence=f"{tried} instances, smallest relative margin {worst:.3g}",
                                     negative_control=negative))

    def violates(candidate: Instance) -> bool:
        return float(margin(batched(candidate))[0]) < -tolerance

    shrunk, steps = shrink(found, violates, candidates or _default_candidates(found), valid)
    one = batched(shrunk)
    counterexample = {**plain(shrunk), "lhs": float(np.asarray(lhs(one)).ravel()[0]),
                      "rhs": float(np.asarray(rhs(one)).ravel()[0])}
    return CheckResult(name, "fails", instances=tried, worst_slack=worst, counterexample=counterexample,
                       evidence=f"violated on {violations} of {tried} instances; shrunk in {steps} steps",
                       details={"found": plain(found), "shrink_steps": steps}, negative_control=negative)


def _batches(sampler: Sampler, rng: np.random.Generator, instances: int, batch_size: int):
    """``sampler``'s batches until ``instances`` instances are drawn."""
    drawn = 0
    while drawn < instances:
        batch = sampler(rng, min(batch_size, instances - drawn))
        drawn += min(batch_size, instances - drawn)
        yield batch


def _bound_control(margin: Callable[[Instance], np.ndarray], control: Sampler, description: str, instances: int,
                   batch_size: int, seed: int, tolerance: float, real: float) -> NegativeControl:
    """The bound's relative margins on ``instances`` draws of the ``control`` sampler
    (its own stream at ``seed``), with the real instances' smallest margin beside."""
    if instances < 1:
        raise ValueError(f"control_instances must be >= 1, got {instances}")
    rng = np.random.default_rng([seed, 1])
    margins = np.concatenate([np.asarray(margin(batch), float).ravel()
                              for batch in _batches(control, rng, instances, batch_size)])
    result = margin_control(description, margins, "relative margin", tolerance)
    return dataclasses.replace(result, real=real)


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
    control_errors: np.ndarray | None = None,
    control_description: str = "a broken algorithm",
) -> CheckResult:
    """The verdict on a rate ``E error <~ C x^claimed`` from measurements
    ``errors[len(values), repeats]``: the exponent of the mean over the repeats with its
    bootstrap interval (:func:`theory_checks.fitting.fit_mean_power_law`), the verdict
    and its direction (:func:`theory_checks.verdicts.rate_verdict`; ``bounded``: the
    variable cannot grow without limit), and the status given the measured
    ``hypotheses`` (``hypotheses_unmet`` when one fails).

    ``control_errors`` (same shape as ``errors``) are a broken algorithm's errors at
    the same ``values`` (no clustering, a frozen model): the control is violated when
    their verdict on the claimed rate is ``fails``; its ratio is the mean error over
    ``x^claimed`` at the largest value (the real errors' beside it).  A "holds" whose
    control is missing or not violated is reported ``vacuous``
    (:func:`theory_checks.controls.finalised`)."""
    law = fit_mean_power_law(values, errors, seed=seed)
    verdict = rate_verdict(law, claimed, bounded)
    status = rate_status({variable: verdict}, hypotheses)
    if status == "holds_with_constant":  # no bound's values were given: the exponent decides alone
        status = "holds"
    evidence = f"{variable}: {law.exponent:+.2f} [{law.low:+.2f}, {law.high:+.2f}] vs claimed {claimed:+.2f} " \
               f"({verdict.verdict}: {verdict.direction})"
    negative = None if control_errors is None else _rate_control(
        values, control_errors, claimed, bounded, seed, control_description, variable, errors)
    return finalised(CheckResult(name, status, instances=len(values), exponents={variable: (law, claimed)},
                                 evidence=evidence, hypotheses=tuple(hypotheses), verdicts={variable: verdict},
                                 negative_control=negative))


def _rate_control(values: Sequence[float], errors: np.ndarray, claimed: float, bounded: bool, seed: int,
                  description: str, variable: str, real_errors: np.ndarray) -> NegativeControl:
    """The claimed rate's verdict on a broken algorithm's ``errors``
    (:func:`theory_checks.controls.rate_control`: violated when it ``fails``), against
    the claimed rate ``x^claimed`` itself as the bound (no constant is given here)."""
    shape = np.asarray(values, float) ** claimed
    real = float(np.asarray(real_errors, float).mean(axis=1)[-1] / shape[-1])
    return rate_control(description, values, errors, shape, claimed, variable=variable,
                        real_ratio=real, seed=seed, bounded=bounded)
