"""The attacks of issue 33 (item 3): ByzFL's ``inf``, ``optimal_alie`` and
``optimal_ipm``, and Fang et al.'s (USENIX Security 2020) ``fang_krum`` and
``fang_trimmed_mean``.

The conformance contract (``attacks.check_attack``), options and metadata, then one
property per definition, each checked against an independent computation: the
optimal attacks' choice against every grid value's deviation computed here, Fang's
Krum attack against :mod:`defenses`' Krum, Fang's trimmed-mean attack against
:mod:`defenses`' trimmed mean and ALIE, and ``inf`` against every aggregator.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
import attacks.fang  # registers fang_krum, fang_trimmed_mean
import attacks.scale_search  # registers optimal_alie, optimal_ipm
import attacks.simple  # registers inf
import defenses
from attacks.conformance import check_metadata, messages
from robust_pfl.engine.types import AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
FAST = settings(max_examples=20, deadline=None)
NEW = ["inf", "optimal_alie", "optimal_ipm", "fang_krum", "fang_trimmed_mean"]
RANDOM = {"fang_trimmed_mean"}

EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "optimal_alie": [{"grid": [0.5, 2.0]}],
    "optimal_ipm": [{"grid": [0.1, 4.0, 1.0]}],
    "fang_krum": [{"f": 1, "steps": 3}, {"centre": "zero"}],
    "fang_trimmed_mean": [{"b": 3.0}],
}
INVALID: dict[str, list[tuple[dict[str, Any], str]]] = {
    "optimal_alie": [({"grid": []}, "grid"), ({"grid": [1.0, -2.0]}, "grid"), ({"grid": [math.inf]}, "grid")],
    "optimal_ipm": [({"grid": []}, "grid"), ({"grid": [-1.0]}, "grid"),
                    ({"refine_evaluations": -1}, "refine_evaluations"), ({"line_step": 0.0}, "line_step")],
    "fang_krum": [({"f": -1}, "f"), ({"steps": 0}, "steps"), ({"centre": "median"}, "centre")],
    "fang_trimmed_mean": [({"b": 1.0}, "b"), ({"b": math.nan}, "b")],
}
CONFIGS = [(name, {}) for name in NEW] + [(name, options) for name in NEW for options in EXAMPLES.get(name, [])]
CONFIG_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CONFIGS)]

HONEST, BYZ, D = 10, 3, 20
MASK = torch.tensor([False] * HONEST + [True] * BYZ)


def context(byzantine: torch.Tensor = MASK, seed: int = 0, state: dict[str, Any] | None = None) -> AttackContext:
    return AttackContext(round_index=0, kind="gradient", byzantine=byzantine,
                         cluster_ids=torch.zeros(byzantine.shape[0], dtype=torch.long),
                         generator=torch.Generator().manual_seed(seed), defense_state=state or {})


def instance(seed: int = 0, lead: tuple[int, ...] = (), d: int = D) -> torch.Tensor:
    """10 honest rows N(0.5, 1) from a seeded generator, then 3 Byzantine rows."""
    return torch.randn(*lead, HONEST + BYZ, d, generator=torch.Generator().manual_seed(seed), dtype=F64) + 0.5


def deliver(values: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor = MASK) -> torch.Tensor:
    delivered = values.clone()
    delivered[..., mask, :] = rows
    return delivered


def probe(name: str, **options: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """A defense's ``aggregate`` as the engines expose it: ``[..., S, d] -> [..., 1, d]``."""
    aggregator = defenses.AGGREGATORS[name](**options)
    return lambda delivered: aggregator(delivered).unsqueeze(-2)


def deviation(values: torch.Tensor, rows: torch.Tensor, aggregate: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """``mean ||aggregate(delivered) - honest mean||`` over the leading blocks."""
    mean = values[..., ~MASK, :].mean(dim=-2, keepdim=True)
    return float((aggregate(deliver(values, rows)) - mean).norm(dim=-1).mean())


# -- registration, conformance and options ---------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_registered_with_metadata(name):
    cls = attacks.REGISTRY[name]
    check_metadata(cls)
    assert cls.name == name


@pytest.mark.parametrize(("name", "options"), CONFIGS, ids=CONFIG_IDS)
def test_conformance(name, options):
    attacks.check_attack(attacks.build(name, options), random=name in RANDOM)


@pytest.mark.parametrize(("name", "options", "field"),
                         [(name, options, field) for name, cases in INVALID.items() for options, field in cases])
def test_invalid_options_name_the_field(name, options, field):
    with pytest.raises(ValueError) as info:
        attacks.build(name, options)
    assert f"{name}.{field}" in str(info.value)
    assert type(info.value) is ValueError


@pytest.mark.parametrize("name", NEW)
def test_frozen_pickled_and_described(name):
    cls = attacks.REGISTRY[name]
    options = dict(EXAMPLES.get(name, [{}])[0])
    attack = cls(**options)
    assert attack == cls(**options) and hash(attack) == hash(cls(**options))
    again = pickle.loads(pickle.dumps(attack))
    assert again == attack and repr(again) == repr(attack)
    assert dataclasses.replace(attack) == attack
    fields = {item.name for item in dataclasses.fields(cls) if item.init}
    assert set(attacks.describe(cls)["descriptions"]) == fields


def test_needs_and_reads():
    assert attacks.REGISTRY["inf"].needs == frozenset() and not attacks.reads_messages(attacks.build("inf"))
    for name in ("optimal_alie", "optimal_ipm"):
        assert attacks.REGISTRY[name].needs == {"omniscient", "adaptive"}
    for name in ("fang_krum", "fang_trimmed_mean"):
        assert attacks.REGISTRY[name].needs == {"omniscient", "defense_aware"}
        assert attacks.reads_messages(attacks.build(name))


@pytest.mark.parametrize(("name", "options"), CONFIGS, ids=CONFIG_IDS)
def test_finite_rows_when_everyone_is_byzantine_unless_reading_nothing(name, options):
    attack = attacks.build(name, options)
    out = attack(messages(7, 5), context(byzantine=torch.ones(7, dtype=torch.bool)))
    assert out.shape == (7, 5)
    assert bool(torch.isfinite(out).all()) or not attacks.reads_messages(attack)


# -- inf --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_inf_rows_are_all_plus_inf(dtype):
    values = instance(lead=(2,)).to(dtype)
    out = attacks.build("inf")(values, context())
    assert out.shape == (2, BYZ, D) and out.dtype == dtype
    assert bool((out == math.inf).all())
    workspace = values.clone()
    attacks.build("inf").write_rows(workspace[..., HONEST:, :], context())
    assert bool((workspace[..., HONEST:, :] == math.inf).all()) and torch.equal(workspace[..., :HONEST, :],
                                                                                  values[..., :HONEST, :])


@pytest.mark.parametrize("name", sorted(defenses.AGGREGATORS))
def test_every_aggregator_stays_finite_under_inf(name):
    values = instance(lead=(2,))
    delivered = deliver(values, attacks.build("inf")(values, context()))
    out = defenses.AGGREGATORS[name]()(delivered, generator=torch.Generator().manual_seed(1))
    assert out.shape == (2, D) and bool(torch.isfinite(out).all())


# -- optimal ALIE / IPM -------------------------------------------------------------------------
@pytest.mark.parametrize(("defense", "options"), [("trimmed_mean", {"f": 3}), ("median", {}), ("krum", {"f": 3}),
                                                   ("mean", {})])
def test_optimal_alie_picks_the_z_of_largest_deviation(defense, options):
    """The pure grid search (line search and refinement off): every grid ``z`` scored
    here with ALIE(z) itself against the defense; the attack's rows are ALIE's rows at
    the first ``z`` of largest deviation."""
    values = instance(seed=3, lead=(2,))
    aggregate = probe(defense, **options)
    attack = attacks.build("optimal_alie", {"line_evaluations": 0, "refine_evaluations": 0})
    out = attack(values, context(state={"aggregate": aggregate}))
    candidates = [attacks.ALIE(z=z)(values, context()) for z in attack.grid]
    damages = [deviation(values, rows, aggregate) for rows in candidates]
    best = max(damages)
    first = next(i for i, value in enumerate(damages) if value >= best - 1e-9 * max(1.0, best))
    torch.testing.assert_close(out, candidates[first], rtol=1e-10, atol=1e-10)
    assert deviation(values, out, aggregate) == pytest.approx(best, rel=1e-9)
    if defense == "mean":  # the undefended mean: the deviation grows with z
        assert first == len(attack.grid) - 1
    # with the line search and the refinement (the defaults): at least the grid's best
    searched = attacks.build("optimal_alie")(values, context(state={"aggregate": aggregate}))
    assert deviation(values, searched, aggregate) >= best * (1 - 1e-12)


@pytest.mark.parametrize(("defense", "options"), [("trimmed_mean", {"f": 3}), ("median", {}), ("krum", {"f": 3})])
def test_optimal_ipm_picks_the_eps_of_largest_deviation(defense, options):
    values = instance(seed=5, lead=(2,))
    aggregate = probe(defense, **options)
    attack = attacks.build("optimal_ipm", {"grid": [0.1, 0.5, 1.0, 2.0, 5.0, 20.0], "line_evaluations": 0,
                                           "refine_evaluations": 0})
    out = attack(values, context(state={"aggregate": aggregate}))
    candidates = [attacks.IPM(eps=eps)(values, context()) for eps in attack.grid]
    damages = [deviation(values, rows, aggregate) for rows in candidates]
    best = max(damages)
    first = next(i for i, value in enumerate(damages) if value >= best - 1e-9 * max(1.0, best))
    torch.testing.assert_close(out, candidates[first], rtol=1e-10, atol=1e-10)


def test_optimal_alie_without_a_defense_state_uses_the_mean():
    values = instance(seed=1)
    out = attacks.build("optimal_alie", {"grid": [0.5, 3.0, 1.0], "line_evaluations": 0, "refine_evaluations": 0})(
        values, context())
    torch.testing.assert_close(out, attacks.ALIE(z=3.0)(values, context()), rtol=1e-12, atol=1e-12)


# -- Fang et al.: Krum ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fang_krum_gets_its_crafted_row_selected_by_krum(seed):
    """10 honest rows, 3 Byzantine, Krum with f = 3: Krum's output is the crafted row
    exactly, and that row lies beyond every honest row along the attack direction
    ``-sign(mean)`` (the honest mean's neighbourhood left behind)."""
    values = instance(seed)
    out = attacks.build("fang_krum")(values, context())
    assert torch.equal(out, out[:1].expand_as(out))  # copies
    krum = defenses.AGGREGATORS["krum"](f=3)
    assert torch.equal(krum(deliver(values, out)), out[0])
    honest = values[~MASK]
    mean = honest.mean(dim=0)
    sign = torch.sign(mean)
    lam = (mean - out[0]) / sign
    assert float(lam.min()) > 0 and torch.allclose(lam, lam[0].expand_as(lam))  # mean - lambda * sign(mean)
    unit = -sign / sign.norm()
    assert float((out[0] - mean) @ unit) > float(((honest - mean) @ unit).max())
    clean = krum(honest)  # Krum without attack stays with the honest rows
    assert float((out[0] - mean) @ unit) > float((clean - mean) @ unit)


def test_fang_krum_searches_every_block_and_respects_its_budget():
    values = instance(seed=4, lead=(3,))
    attack = attacks.build("fang_krum")
    out = attack(values, context())
    krum = defenses.AGGREGATORS["krum"](f=3)
    torch.testing.assert_close(krum(deliver(values, out)), out[:, 0], rtol=0, atol=0)
    for block in range(3):  # each block on its own gives the same rows
        torch.testing.assert_close(attack(values[block], context()), out[block], rtol=0, atol=0)
    # the first lambda is the paper's upper bound: with one step nothing is halved
    honest = values[0, ~MASK]
    mean = honest.mean(dim=0, keepdim=True)
    m, c = HONEST + BYZ, BYZ  # Fang et al. Sec. 4.2's bound, written out row by row
    near = min(sum(sorted(float((honest[i] - honest[l]).norm()) for l in range(HONEST) if l != i)[: m - c - 2])
               for i in range(HONEST))
    far = max(float((honest[i] - mean[0]).norm()) for i in range(HONEST))
    bound = near / ((m - 2 * c - 1) * math.sqrt(D)) + far / math.sqrt(D)
    one = attacks.build("fang_krum", {"steps": 1})(values[0], context())
    torch.testing.assert_close(one[0], (mean - bound * torch.sign(mean))[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 7])
def test_fang_krum_selection_test_agrees_with_krum(seed):
    """The attack's test of "Krum selects the crafted copies" against
    :mod:`defenses`' Krum, over lambdas from inside to far outside the honest rows."""
    from attacks.fang import krum_selects_copies

    values = instance(seed, d=8)
    honest = values[~MASK]
    mean = honest.mean(dim=0, keepdim=True)
    squared = torch.cdist(honest, honest).square()
    krum = defenses.AGGREGATORS["krum"](f=3)
    outcomes = set()
    for lam in [0.0, 0.05, 0.2, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0]:
        candidate = mean - lam * torch.sign(mean)
        predicted = bool(krum_selects_copies(candidate, honest, squared, BYZ, 3))
        actual = torch.equal(krum(deliver(values, candidate.expand(BYZ, -1))), candidate[0])
        assert predicted == actual, lam
        outcomes.add(actual)
    assert outcomes == {True, False}  # both sides of the boundary were exercised


def test_fang_krum_zero_centre_sends_minus_lambda_sign():
    values = instance(seed=2)
    out = attacks.build("fang_krum", {"centre": "zero"})(values, context())
    sign = torch.sign(values[~MASK].mean(dim=0))
    lam = -out[0] / sign
    assert float(lam.min()) > 0 and torch.allclose(lam, lam[0].expand_as(lam))


# -- Fang et al.: trimmed mean ----------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fang_trimmed_mean_moves_the_trimmed_mean_farther_than_alie(seed):
    values = instance(seed)
    aggregate = probe("trimmed_mean", f=3)
    fang = attacks.build("fang_trimmed_mean")(values, context(seed=seed))
    alie = attacks.ALIE(z=1.0)(values, context())
    assert deviation(values, fang, aggregate) > deviation(values, alie, aggregate)
    mean = values[~MASK].mean(dim=0)  # and it moves against the honest mean
    assert float((aggregate(deliver(values, fang))[0] - mean) @ torch.sign(mean)) < 0


@FAST
@given(seed=st.integers(0, 10_000), b=st.floats(1.01, 5.0), lead=st.lists(st.integers(1, 3), max_size=2))
def test_fang_trimmed_mean_values_lie_in_the_papers_intervals(seed, b, lead):
    values = instance(seed, lead=tuple(lead), d=6)
    out = attacks.build("fang_trimmed_mean", {"b": b})(values, context(seed=seed))
    honest = values[..., ~MASK, :]
    mean = honest.mean(dim=-2, keepdim=True)
    low, high = honest.amin(dim=-2, keepdim=True), honest.amax(dim=-2, keepdim=True)
    down = (mean > 0).expand_as(out)
    tol = 1e-12
    # below the minimum where the mean is positive, above the maximum elsewhere
    assert bool((out[down] <= low.expand_as(out)[down] + tol).all())
    assert bool((out[~down] >= high.expand_as(out)[~down] - tol).all())
    # within [min/b, min] or [b*min, min]; [max, b*max] or [max, max/b]
    edge = torch.where(down, low.expand_as(out), high.expand_as(out))
    ratio = out / edge
    outward = torch.where(down, edge < 0, edge > 0)
    assert bool((ratio[outward] >= 1 - tol).all() and (ratio[outward] <= b + tol).all())
    assert bool((ratio[~outward] >= 1 / b - tol).all() and (ratio[~outward] <= 1 + tol).all())
