"""The scale search of ``optimised``, ``optimal_alie`` and ``optimal_ipm`` (issue 41,
item 2): it reaches 0 and scales far beyond any grid, and against every registered
aggregator ``optimal_alie`` and ``optimal_ipm`` are at least as damaging as ByzFL's
search on the same inputs in at least 95% of the cases.

The reference is ByzFL's search (``Optimal_ALittleIsEnough`` /
``Optimal_InnerProductManipulation``, LPD-EPFL/byzfl ``byzfl/attacks/attacks.py``)
rewritten here in numpy from its description, with its defaults: evaluate the factor
0; expansion: try ``best + delta`` (``delta = 10``), doubling ``delta`` after each
strict improvement, until a try does not improve (then ``delta *= 0.8``); contraction:
each remaining try is ``best + delta``, kept if it improves, ``delta *= 0.8`` after
each; 20 evaluations in all.  It searches the same family of rows as ours (ALIE:
``mean - z * std``, sample std; IPM: ``-eps * mean``) so that the comparison is of the
searches alone, without ByzFL's default pre-aggregation (clipping): every damage is
``||aggregator(honest rows + 3 copies of the row) - honest mean||``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np
import pytest
import torch

import attacks
import attacks.scale_search  # registers optimal_alie, optimal_ipm
import defenses
from attacks.search import DEFAULT_SCALES, maximise_scale
from defenses.aggregators import BudgetedAggregator
from robust_pfl.engine.types import AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

HONEST, BYZANTINE, D = 12, 3, 20
SENDERS = HONEST + BYZANTINE
MASK = torch.tensor([False] * HONEST + [True] * BYZANTINE)
SEEDS = range(10)
TOLERANCE = 1e-6  # ours counts as at least as damaging when >= reference * (1 - TOLERANCE)


# -- the reference: ByzFL's search, written from its description -----------------------------------
def byzfl_line_search(score: Callable[[float], float], evals: int = 20, start: float = 0.0, delta: float = 10.0,
                      ratio: float = 0.8) -> tuple[float, list[float]]:
    """ByzFL's line search of the factor maximising ``score``: the best factor and
    every factor tried, in order."""
    tried = [start]
    best_x, best_y = start, score(start)
    remaining = evals - 1
    while remaining > 0:  # expansion
        x = best_x + delta
        tried.append(x)
        y = score(x)
        remaining -= 1
        if not y > best_y:
            delta *= ratio
            break
        best_x, best_y = x, y
        delta *= 2
    while remaining > 0:  # contraction
        x = best_x + delta
        tried.append(x)
        y = score(x)
        remaining -= 1
        if y > best_y:
            best_x, best_y = x, y
        delta *= ratio
    return best_x, tried


def family_row(attack: str, honest: np.ndarray, factor: float) -> np.ndarray:
    """The row of ``attack`` at ``factor``, computed here: ALIE ``mean - z * std``
    (sample std), IPM ``-eps * mean``."""
    if attack == "optimal_alie":
        return honest.mean(axis=0) - factor * honest.std(axis=0, ddof=1)
    return -factor * honest.mean(axis=0)


# -- inputs and aggregators ---------------------------------------------------------------------------
def inputs(seed: int) -> np.ndarray:
    """12 honest rows in R^20, of a random spread; odd seeds far from the origin."""
    rng = np.random.default_rng(seed)
    shift = rng.normal(size=D) * 3.0 if seed % 2 else np.zeros(D)
    return rng.normal(size=(HONEST, D)) * rng.uniform(0.3, 3.0) + shift


def aggregator_names() -> list[str]:
    """Every registered aggregator: each one serves 15 senders, the budgeted ones with
    f = 3 (the Byzantine count); none is left out (a new rule that cannot take 15
    senders with f = 3 fails :func:`aggregator` loudly rather than being skipped)."""
    return sorted(defenses.AGGREGATORS)


@functools.cache
def aggregator(name: str) -> defenses.Aggregator:
    budgeted = issubclass(defenses.AGGREGATORS[name], BudgetedAggregator)
    rule = defenses.make_aggregator({"name": name, "f": BYZANTINE} if budgeted else {"name": name})
    rule.check(SENDERS)
    return rule


def probe(rule: defenses.Aggregator) -> Callable[[torch.Tensor], torch.Tensor]:
    """The defense's ``aggregate`` as the engines expose it (``[..., S, d] -> [..., 1,
    d]``), randomised rules (bucketing, DnC) seeded alike at every call."""
    return lambda delivered: rule(delivered, generator=torch.Generator().manual_seed(0)).unsqueeze(-2)


def damage(rule: defenses.Aggregator, honest: np.ndarray, rows: np.ndarray) -> float:
    """``||rule(honest rows + Byzantine rows) - honest mean||`` (``rows``: one row,
    copied to every Byzantine slot, or one per slot); ``-inf`` when not finite."""
    rows = np.broadcast_to(rows, (BYZANTINE, D))
    out = probe(rule)(torch.tensor(np.vstack([honest, rows])))[0].numpy()
    value = float(np.linalg.norm(out - honest.mean(axis=0)))
    return value if math.isfinite(value) else -math.inf


def context(state: dict[str, Any] | None = None) -> AttackContext:
    return AttackContext(round_index=0, kind="gradient", byzantine=MASK,
                         cluster_ids=torch.zeros(SENDERS, dtype=torch.long),
                         generator=torch.Generator().manual_seed(0), defense_state=state or {})


def our_rows(attack: str, rule: defenses.Aggregator | None, honest: np.ndarray, **options: Any) -> np.ndarray:
    """The ``[3, d]`` rows of our attack against ``rule`` (None: no defense state)."""
    messages = torch.tensor(np.vstack([honest, np.zeros((BYZANTINE, D))]))
    state = {"aggregate": probe(rule)} if rule is not None else {}
    return attacks.build(attack, options)(messages, context(state)).numpy()


@functools.cache
def reference_damage(attack: str, name: str, seed: int) -> float:
    honest = inputs(seed)
    rule = aggregator(name)
    best, _ = byzfl_line_search(lambda factor: damage(rule, honest, family_row(attack, honest, factor)))
    return damage(rule, honest, family_row(attack, honest, best))


def comparison(attack: str, **options: Any) -> tuple[int, int, list[str]]:
    """(cases where ours is at least as damaging as the reference, cases, the others)."""
    wins, cases, losses = 0, 0, []
    for name in aggregator_names():
        for seed in SEEDS:
            honest = inputs(seed)
            theirs = reference_damage(attack, name, seed)
            ours = damage(aggregator(name), honest, our_rows(attack, aggregator(name), honest, **options))
            cases += 1
            if ours >= theirs * (1 - TOLERANCE):
                wins += 1
            else:
                losses.append(f"{name} seed {seed}: {ours:.6g} < {theirs:.6g}")
    return wins, cases, losses


# -- against ByzFL's search -------------------------------------------------------------------------
# optimal_alie: 20 s, marked slow; the default run keeps optimal_ipm
@pytest.mark.parametrize("attack", [pytest.param("optimal_alie", marks=pytest.mark.slow), "optimal_ipm"])
def test_at_least_as_damaging_as_byzfl_search_in_95_percent_of_cases(attack):
    wins, cases, losses = comparison(attack)
    assert cases == len(aggregator_names()) * len(SEEDS)
    print(f"{attack}: at least as damaging as ByzFL's search in {wins} of {cases} cases")
    assert wins >= 0.95 * cases, f"{attack}: at least as damaging in {wins} of {cases} only; {losses[:10]}"


@pytest.mark.slow  # a control (the bar can fail), 17 s; the bar itself runs by default
def test_the_old_grid_falls_short_of_the_bar():
    """The comparison can fail: the former search (a grid of 16 z from 0.1 to 100, no
    line search) is at least as damaging in fewer than 95% of the cases."""
    old = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0)
    wins, cases, _ = comparison("optimal_alie", grid=old, line_evaluations=0, refine_evaluations=0)
    assert wins < 0.95 * cases, f"the old grid: {wins} of {cases}"


def test_the_line_search_tries_the_factors_byzfl_tries():
    """With no grid and no refinement, the search evaluates exactly the factors of
    ByzFL's search, in its order, on damages of every shape."""
    shapes = [lambda x: x, lambda x: -abs(x - 37.0), lambda x: math.sin(x / 7.0), lambda x: -x,
              lambda x: min(x, 25.0), lambda x: math.nan if x > 100 else x]
    for shape in shapes:
        calls: list[float] = []
        maximise_scale(lambda x: calls.append(x) or shape(x), (), line_evaluations=20, refine_evaluations=0)
        _, tried = byzfl_line_search(lambda x: -math.inf if math.isnan(shape(x)) else shape(x))
        assert calls == list(dict.fromkeys(tried))


# -- properties of the search ---------------------------------------------------------------------
def far_from_mean(delivered: torch.Tensor) -> torch.Tensor:
    """A constructed defense whose deviation is largest when the Byzantine rows sit at
    the honest mean: ``honest mean + e_1 / (1 + ||Byzantine mean - honest mean||)``."""
    mean = delivered[..., ~MASK, :].mean(dim=-2, keepdim=True)
    gap = (delivered[..., MASK, :].mean(dim=-2, keepdim=True) - mean).norm(dim=-1, keepdim=True)
    unit = torch.zeros_like(mean)
    unit[..., 0] = 1.0
    return mean + unit / (1.0 + gap)


def far_from_zero(delivered: torch.Tensor) -> torch.Tensor:
    """As :func:`far_from_mean`, largest when the Byzantine rows are zero."""
    mean = delivered[..., ~MASK, :].mean(dim=-2, keepdim=True)
    size = delivered[..., MASK, :].norm(dim=-1).mean(dim=-1, keepdim=True).unsqueeze(-1)
    unit = torch.zeros_like(mean)
    unit[..., 0] = 1.0
    return mean + unit / (1.0 + size)


def test_the_search_returns_zero_when_zero_is_best():
    honest = inputs(1)
    mean = honest.mean(axis=0)
    state = {"aggregate": far_from_mean}
    messages = torch.tensor(np.vstack([honest, np.zeros((BYZANTINE, D))]))
    for attack in (attacks.build("optimised"), attacks.build("optimal_alie")):
        np.testing.assert_allclose(attack(messages, context(state)).numpy(), np.broadcast_to(mean, (3, D)),
                                   rtol=0, atol=1e-12)
    rows = attacks.build("optimal_ipm")(messages, context({"aggregate": far_from_zero})).numpy()
    np.testing.assert_allclose(rows, 0.0, rtol=0, atol=1e-12)  # eps = 0
    assert maximise_scale(lambda x: -abs(x), (5.0, 1.0)) == 0.0  # 0 from the line search, off the grid


def test_the_search_goes_far_beyond_the_grid_against_the_plain_mean():
    honest = inputs(3)
    rows = our_rows("optimal_alie", None, honest)  # no defense state: the plain mean
    z = (honest.mean(axis=0) - rows) / honest.std(axis=0, ddof=1)
    np.testing.assert_allclose(z, z[0, 0], rtol=1e-9)
    assert z[0, 0] >= 1e4
    eps = -our_rows("optimal_ipm", aggregator("mean"), honest)[0] / honest.mean(axis=0)
    assert np.allclose(eps, eps[0], rtol=1e-9) and eps[0] >= 1e4
    messages = torch.tensor(np.vstack([honest, np.zeros((BYZANTINE, D))]))
    base = attacks.build("alie")(messages, context()).numpy() - honest.mean(axis=0)
    scale = (attacks.build("optimised")(messages, context()).numpy() - honest.mean(axis=0)) / base
    assert scale.min() >= 1e4 and scale.max() <= scale.min() * (1 + 1e-9)
    assert maximise_scale(lambda x: x) >= 5e6  # ByzFL's 20 evaluations reach 10 * (2^19 - 1)


def test_the_search_refines_an_interior_optimum_between_grid_values():
    assert abs(maximise_scale(lambda x: -(x - 3.3) ** 2, (0.0, 1.0, 10.0)) - 3.3) < 0.2
    peak = maximise_scale(lambda x: -abs(x - 0.17), DEFAULT_SCALES)
    assert abs(peak - 0.17) < abs(0.1 - 0.17)  # closer than the best grid value


def test_the_search_ignores_non_finite_damage():
    assert maximise_scale(lambda x: math.inf if x > 2 else x, (0.0, 1.0, 5.0)) <= 2
    assert maximise_scale(lambda x: math.nan if x > 40 else x, (0.0, 1.0, 5.0)) <= 40
    assert maximise_scale(lambda x: math.nan, (0.0, 1.0)) == 1.0  # none finite: the base rows
    honest = inputs(0)
    messages = torch.tensor(np.vstack([honest, np.zeros((BYZANTINE, D))]))

    def nan_far_out(delivered: torch.Tensor) -> torch.Tensor:  # the mean, NaN once the rows leave 6 std
        rows = delivered[..., MASK, :]
        mean = delivered[..., ~MASK, :].mean(dim=-2, keepdim=True)
        std = delivered[..., ~MASK, :].std(dim=-2, keepdim=True)
        out = delivered.mean(dim=-2, keepdim=True)
        return out if bool(((rows - mean).abs() <= 6 * std).all()) else torch.full_like(out, math.nan)

    rows = attacks.build("optimal_alie")(messages, context({"aggregate": nan_far_out})).numpy()
    z = (honest.mean(axis=0) - rows) / honest.std(axis=0, ddof=1)
    assert 5.0 <= z.min() and z.max() <= 6.0  # as far as the damage stays finite


def test_the_search_is_deterministic_and_evaluates_each_value_once():
    calls: list[float] = []

    def wavy(x: float) -> float:
        calls.append(x)
        return math.sin(x) + 0.01 * x

    first = maximise_scale(wavy, DEFAULT_SCALES)
    assert len(calls) == len(set(calls)) <= len(DEFAULT_SCALES) + 20 + 8
    order, calls[:] = list(calls), []
    assert maximise_scale(wavy, DEFAULT_SCALES) == first and calls == order
    honest = inputs(5)
    rule = aggregator("trimmed_mean")
    for attack in ("optimised", "optimal_alie", "optimal_ipm"):
        out = [our_rows(attack, rule, honest) for _ in range(2)]
        assert np.array_equal(out[0], out[1])


def test_ties_go_to_the_value_evaluated_first():
    assert maximise_scale(lambda x: 1.0, (3.0, 0.0, 7.0)) == 3.0
    assert maximise_scale(lambda x: min(x, 2.0), (0.0, 2.0, 5.0)) == 2.0


# -- the warm-started search (issue 53, item 7) -----------------------------------------------------
WARM_EVERY, ROUNDS, WARM_SEEDS = 10, 4, range(4)


def drifting(seed: int, round_index: int) -> np.ndarray:
    """The honest rows of round ``round_index`` of a run: :func:`inputs` moved by a
    random drift per round and fresh noise of a tenth of their spread, as honest
    gradients move between training rounds."""
    rng = np.random.default_rng(10_000 + seed)
    drift = rng.normal(size=D) * 0.3
    base = inputs(seed)
    noise = np.random.default_rng([seed, round_index]).normal(size=base.shape) * 0.1 * base.std()
    return base + round_index * drift + noise


@functools.cache
def warm_reference(attack: str, name: str, seed: int, round_index: int) -> float:
    """The damage of ByzFL's search in round ``round_index`` of :func:`drifting`."""
    rule, honest = aggregator(name), drifting(seed, round_index)
    best, _ = byzfl_line_search(lambda factor: damage(rule, honest, family_row(attack, honest, factor)))
    return damage(rule, honest, family_row(attack, honest, best))


def warm_comparison(attack: str, **options: Any) -> tuple[int, int, list[str], int]:
    """Round after round of one run (one memory), the warm-started search against
    ByzFL's search of each round: (cases at least as damaging, cases, the others,
    damage evaluations of the warm rounds)."""
    wins, cases, losses, evaluations = 0, 0, [], 0
    for name in aggregator_names():
        rule = aggregator(name)
        for seed in WARM_SEEDS:
            memory: dict[str, Any] = {}
            built = attacks.build(attack, {"search_every": WARM_EVERY, **options})
            for round_index in range(ROUNDS):
                honest = drifting(seed, round_index)
                theirs = warm_reference(attack, name, seed, round_index)
                messages = torch.tensor(np.vstack([honest, np.zeros((BYZANTINE, D))]))
                calls = [0]

                def counted(delivered: torch.Tensor) -> torch.Tensor:
                    calls[0] += 1
                    return probe(rule)(delivered)

                ctx = AttackContext(round_index=round_index, kind="gradient", byzantine=MASK,
                                    cluster_ids=torch.zeros(SENDERS, dtype=torch.long),
                                    generator=torch.Generator().manual_seed(0),
                                    defense_state={"aggregate": counted}, memory=memory)
                ours = damage(rule, honest, built(messages, ctx).numpy())
                if round_index % WARM_EVERY:
                    evaluations += calls[0]
                cases += 1
                if ours >= theirs * (1 - TOLERANCE):
                    wins += 1
                else:
                    losses.append(f"{name} seed {seed} round {round_index}: {ours:.6g} < {theirs:.6g}")
    return wins, cases, losses, evaluations


@pytest.mark.parametrize("attack", [pytest.param("optimal_alie", marks=pytest.mark.slow), "optimal_ipm"])
def test_the_warm_started_search_stays_at_least_as_damaging_as_byzfl_round_after_round(attack):
    wins, cases, losses, evaluations = warm_comparison(attack)
    warm_rounds = len(aggregator_names()) * len(WARM_SEEDS) * (ROUNDS - 1)
    print(f"{attack} warm: {wins} of {cases}; {evaluations / warm_rounds:.1f} evaluations a warm round")
    assert wins >= 0.95 * cases, f"{attack} warm: at least as damaging in {wins} of {cases} only; {losses[:10]}"
    assert evaluations <= 12 * warm_rounds  # against the full search's 36 (8 grid, 20 line, 8 refinement)


@pytest.mark.slow  # a control (the warm bar can fail), 28 s; the warm bar itself runs by default
def test_a_warm_start_without_refinement_falls_short_of_the_bar():
    """The round-after-round comparison can fail: a warm search with half the
    refinements loses to ByzFL's search too often."""
    wins, cases, _, _ = warm_comparison("optimal_alie", warm_refine_evaluations=4)
    assert wins < 0.95 * cases, f"no refinement: {wins} of {cases}"


def test_the_warm_search_starts_from_the_remembered_value_and_searches_fully_on_schedule():
    calls: list[float] = []
    peak = lambda x: calls.append(x) or -abs(x - 40.0)  # noqa: E731
    assert maximise_scale(peak, DEFAULT_SCALES, warm=30.0) == pytest.approx(40.0, abs=4.0)
    assert calls[:4] == [0.0, 30.0, 60.0, 15.0] and len(calls) <= 12  # 0, b, 2b, b/2, then refinements
    from attacks.search import warm_start

    memory = {"k": 3.0}
    assert warm_start(memory, "k", 10, 10) is None and warm_start(memory, "k", 11, 10) == 3.0
    assert warm_start({}, "k", 11, 10) is None and warm_start(memory, "k", 11, 1) is None
