"""The defense-specific attacks of Blades (issue 33, item 3): ``clipped_clustering_attack``
and ``signguard_attack`` (:mod:`attacks.defense_aware`).

The conformance contract, options and metadata, then each attack against its defense
on constructed instances (several seeds): the defense's own clustering keeps the
rows (recomputed here with :mod:`defenses`' clustering functions), and the aggregate
moves farther from the honest mean than under ALIE (``z = 1``) and a sign flip.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from typing import Any

import pytest
import torch

import attacks
import attacks.defense_aware  # registers clipped_clustering_attack, signguard_attack
import defenses
from attacks.conformance import check_metadata
from attacks.defense_aware import ClippedClusteringAttack, SignGuardAttack
from robust_pfl.engine.rows import agglomerate
from defenses.aggregators import two_means
from robust_pfl.engine.types import AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
NEW = ["clipped_clustering_attack", "signguard_attack"]
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "clipped_clustering_attack": [{"grid": 3, "steps": 4, "scale": 2.0}, {"steps": 0}],
    "signguard_attack": [{"window": 1}, {"window": 32, "scale": 0.5, "tiny": 0.1}],
}
INVALID: dict[str, list[tuple[dict[str, Any], str]]] = {
    "clipped_clustering_attack": [({"grid": 0}, "grid"), ({"steps": -1}, "steps"), ({"scale": 0.0}, "scale"),
                                  ({"scale": math.inf}, "scale")],
    "signguard_attack": [({"window": 0}, "window"), ({"scale": -1.0}, "scale"), ({"tiny": 1.0}, "tiny")],
}
CONFIGS = [(name, {}) for name in NEW] + [(name, options) for name in NEW for options in EXAMPLES[name]]
CONFIG_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CONFIGS)]

HONEST, BYZ = 10, 3
MASK = torch.tensor([False] * HONEST + [True] * BYZ)
SEEDS = range(5)


def context(byzantine: torch.Tensor = MASK, seed: int = 0, state: dict[str, Any] | None = None) -> AttackContext:
    return AttackContext(round_index=0, kind="gradient", byzantine=byzantine,
                         cluster_ids=torch.zeros(byzantine.shape[0], dtype=torch.long),
                         generator=torch.Generator().manual_seed(seed), defense_state=state or {})


def instance(seed: int, d: int, mean: float, lead: tuple[int, ...] = ()) -> torch.Tensor:
    """``HONEST + BYZ`` rows ``N(mean, 1)`` per coordinate from a seeded generator."""
    return torch.randn(*lead, HONEST + BYZ, d, generator=torch.Generator().manual_seed(seed), dtype=F64) + mean


def deliver(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    delivered = values.clone()
    delivered[..., MASK, :] = rows
    return delivered


def deviation(values: torch.Tensor, rows: torch.Tensor, aggregator: Any, seed: int = 1) -> float:
    """``||aggregate(delivered) - honest mean||`` (mean over leading blocks)."""
    mean = values[..., ~MASK, :].mean(dim=-2)
    out = aggregator(deliver(values, rows), generator=torch.Generator().manual_seed(seed))
    return float((out - mean).norm(dim=-1).mean())


def probe(aggregator: Any) -> Any:
    """A defense's ``aggregate`` as the engines expose it: ``[..., S, d] -> [..., 1, d]``."""
    return lambda delivered: aggregator(delivered).unsqueeze(-2)


def baselines(values: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"alie": attacks.ALIE(z=1.0)(values, context()), "sign_flip": attacks.build("bit_flip")(values, context())}


# -- registration, conformance and options ---------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_registered_with_metadata(name):
    cls = attacks.REGISTRY[name]
    check_metadata(cls)
    assert cls.name == name


@pytest.mark.parametrize(("name", "options"), CONFIGS, ids=CONFIG_IDS)
def test_conformance(name, options):
    attacks.check_attack(attacks.build(name, options), random=False)


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
    options = dict(EXAMPLES[name][0])
    attack = cls(**options)
    assert attack == cls(**options) and hash(attack) == hash(cls(**options))
    again = pickle.loads(pickle.dumps(attack))
    assert again == attack and repr(again) == repr(attack)
    with pytest.raises(dataclasses.FrozenInstanceError):
        attack.scale = 3.0
    fields = {item.name for item in dataclasses.fields(cls) if item.init}
    assert set(attacks.describe(cls)["descriptions"]) == fields


def test_needs():
    assert ClippedClusteringAttack.needs == {"omniscient", "adaptive", "defense_aware"}
    assert SignGuardAttack.needs == {"omniscient", "defense_aware"}


@pytest.mark.parametrize("name", NEW)
def test_leading_blocks_are_independent_problems(name):
    values = instance(3, 60, 0.5, lead=(3,))
    values[1] *= -2.0  # blocks of other scales and directions
    attack = attacks.build(name)
    together = attack(values, context())
    for block in range(3):
        alone = attack(values[block], context())
        torch.testing.assert_close(together[block], alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NEW)
def test_no_byzantine_sender_gives_no_row(name):
    values = instance(0, 8, 1.0)
    out = attacks.build(name)(values, context(byzantine=torch.zeros(HONEST + BYZ, dtype=torch.bool)))
    assert out.shape == (0, 8)


# -- ClippedClustering -----------------------------------------------------------------------------
def kept_by_clustering(delivered: torch.Tensor) -> bool:
    """Whether ClippedClustering's clustering (cosine distances, average linkage, two
    clusters, the larger kept; :mod:`defenses`' ``agglomerate``) keeps every Byzantine row."""
    units = delivered / delivered.norm(dim=-1, keepdim=True)
    distance = 1.0 - (units @ units.transpose(-1, -2)).clamp(-1.0, 1.0)
    present = torch.ones(delivered.shape[:-1], dtype=torch.bool)
    labels, sizes = agglomerate(distance, present, "average", clusters=2)
    larger = sizes.argmax(dim=-1, keepdim=True)
    return bool((labels[..., MASK] == larger).all())


CLUSTERED = [(seed, d, mean) for seed in SEEDS for d, mean in ((50, 1.0), (50, 0.5), (20, 0.5))]


@pytest.mark.parametrize(("seed", "d", "mean"), CLUSTERED)
def test_clipped_clustering_attack_is_kept_and_beats_alie_and_sign_flip(seed, d, mean):
    values = instance(seed, d, mean)
    aggregator = defenses.AGGREGATORS["clipped_clustering"]()
    attack = attacks.build("clipped_clustering_attack")
    by_rule = attack(values, context())
    by_probe = attack(values, context(state={"aggregate": probe(aggregator)}))
    # the rule computed in the attack and the defense's probe find the same angle here
    torch.testing.assert_close(by_probe, by_rule, rtol=1e-9, atol=1e-9)
    honest = values[~MASK]
    median = honest.norm(dim=-1).sort().values[HONEST // 2 - 1:HONEST // 2 + 1].mean()  # HONEST even
    torch.testing.assert_close(by_rule.norm(dim=-1), median.expand(BYZ), rtol=1e-10, atol=1e-10)
    assert kept_by_clustering(deliver(values, by_rule))
    damage = deviation(values, by_rule, aggregator)
    for name, rows in baselines(values).items():
        assert damage > deviation(values, rows, aggregator), name


@pytest.mark.parametrize("seed", SEEDS)
def test_clipped_clustering_attack_sits_at_the_edge_of_the_majority(seed):
    """Turned a bisection step further from the honest mean (in the plane of the rows
    and the mean), the rows leave the larger cluster: the search went as far as it could."""
    values = instance(seed, 50, 1.0)
    attack = attacks.build("clipped_clustering_attack")
    rows = attack(values, context())
    u = values[~MASK].mean(dim=0)
    u = u / u.norm()
    r = rows[0]
    across = r - (r @ u) * u
    v = across / across.norm()
    theta = math.atan2(float(r @ v), float(r @ u))
    assert 0 < theta < math.pi
    further = theta + math.pi / (attack.grid * 2**attack.steps)
    turned = r.norm() * (math.cos(further) * u + math.sin(further) * v)
    assert not kept_by_clustering(deliver(values, turned.expand(BYZ, -1)))


def test_clipped_clustering_attack_goes_to_minus_the_mean_when_nothing_stops_it():
    """Against the plain mean every angle influences the aggregate: the probe keeps the
    rows at pi, i.e. -m * unit(mean)."""
    values = instance(2, 30, 1.0)
    mean_probe = lambda delivered: delivered.mean(dim=-2, keepdim=True)
    rows = attacks.build("clipped_clustering_attack")(values, context(state={"aggregate": mean_probe}))
    honest = values[~MASK]
    direction = -honest.mean(dim=0) / honest.mean(dim=0).norm()
    median = honest.norm(dim=-1).sort().values[HONEST // 2 - 1:HONEST // 2 + 1].mean()
    torch.testing.assert_close(rows, (median * direction).expand(BYZ, -1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_clipped_clustering_attack_ignores_non_finite_honest_rows_as_the_defense_does(dtype):
    """NaN and Inf honest rows are left out of the statistics and of the clustering, by
    the rule computed in the attack and by the defense's probe alike."""
    values = instance(1, 20, 1.0, lead=(2,)).to(dtype)
    values[:, 0, 0] = math.nan
    values[:, 2, 1] = math.inf
    aggregator = defenses.AGGREGATORS["clipped_clustering"]()
    attack = attacks.build("clipped_clustering_attack")
    by_rule = attack(values, context())
    by_probe = attack(values, context(state={"aggregate": probe(aggregator)}))
    assert by_rule.dtype == dtype and bool(torch.isfinite(by_rule).all())
    torch.testing.assert_close(by_probe, by_rule)


# -- SignGuard ---------------------------------------------------------------------------------
def fractions(rows: torch.Tensor, start: int, size: int) -> torch.Tensor:
    """``[..., N, 3]`` fractions of positive, zero and negative coordinates on a block."""
    block = rows[..., start:start + size]
    return torch.stack([(block > 0), (block == 0), (block < 0)], dim=-1).sum(dim=-2).to(F64) / size


def passes_signguard_filters(delivered: torch.Tensor, lower: float = 0.1, upper: float = 3.0,
                             sparsity: float = 0.1) -> bool:
    """Recomputed here: every Byzantine row passes the norm-ratio filter and is in the
    larger 2-means cluster of sign fractions (:mod:`defenses`' ``two_means``) for every
    block start on a stride of ``d / 50``."""
    norms = delivered.norm(dim=-1)
    median = norms.sort().values[(norms.shape[-1] - 1) // 2:norms.shape[-1] // 2 + 1].mean()
    ratio = norms[MASK] / median
    if not bool(((ratio >= lower) & (ratio <= upper)).all()):
        return False
    d = delivered.shape[-1]
    size = max(1, math.floor(sparsity * d))
    present = torch.ones(delivered.shape[-2], dtype=torch.bool)
    for start in range(0, d - size + 1, max(1, d // 50)):
        if not bool(two_means(fractions(delivered, start, size), present)[MASK].all()):
            return False
    return True


SIGNED = [(seed, d, mean) for seed in SEEDS for d, mean in ((1000, 0.3), (1000, 0.0), (500, 0.5))]


@pytest.mark.parametrize(("seed", "d", "mean"), SIGNED)
def test_signguard_attack_passes_the_filters_and_beats_sign_flip(seed, d, mean):
    values = instance(seed, d, mean)
    aggregator = defenses.AGGREGATORS["signguard"]()
    rows = attacks.build("signguard_attack")(values, context())
    honest = values[~MASK]
    assert passes_signguard_filters(deliver(values, rows))
    median = honest.norm(dim=-1).sort().values[HONEST // 2 - 1:HONEST // 2 + 1].mean()
    torch.testing.assert_close(rows.norm(dim=-1), median.expand(BYZ), rtol=1e-10, atol=1e-10)
    cosine = float(rows[0] @ honest.mean(dim=0) / (rows[0].norm() * honest.mean(dim=0).norm()))
    assert cosine < -0.5  # pushes against the mean
    for block_seed in (1, 2, 3):  # SignGuard's random coordinate block
        damage = deviation(values, rows, aggregator, seed=block_seed)
        for name, other in baselines(values).items():
            assert damage > deviation(values, other, aggregator, seed=block_seed), name


@pytest.mark.parametrize(("window", "partial_zeros"), [(1, False), (8, False), (8, True), (32, True)])
def test_signguard_attack_matches_the_honest_sign_counts_window_by_window(window, partial_zeros):
    """Over any run of whole windows the rows have the honest rows' average number of
    negative and of zero coordinates, rounded (within one).  (Where zeros and negatives
    together round past a window's length, the negatives are cut: with ``window = 1``
    that happens on coordinates that only some honest rows leave at zero, so that case
    is checked with larger windows only.)"""
    values = instance(4, 203, 0.4)
    values[..., 50:60] = 0.0  # coordinates every honest row leaves at zero
    if partial_zeros:
        values[:4, 100:120] = 0.0  # and some that only a few do
    rows = attacks.build("signguard_attack", {"window": window})(values, context())
    honest = values[~MASK]
    for lo, hi in ((0, 203), (0, window * 3), (window, window * 5), (window * 2, 203)):
        hi = min(hi, 203)
        for sign in (-1, 0):
            expected = float((torch.sign(honest[:, lo:hi]) == sign).sum()) / HONEST
            got = int((torch.sign(rows[0, lo:hi]) == sign).sum())
            assert abs(got - expected) <= 1.0, (lo, hi, sign)
    assert bool((rows[:, 50:60] == 0).all())


# -- the warm-started angle search (issue 53, item 7) ------------------------------------------
def angle_of(rows: torch.Tensor, values: torch.Tensor) -> float:
    """The rows' angle from the honest mean (the search's theta)."""
    u = values[~MASK].mean(dim=0)
    r = rows[0]
    return math.acos(max(-1.0, min(1.0, float(r @ u / (r.norm() * u.norm())))))


def test_the_warm_started_angle_search_stays_with_the_full_search_round_after_round():
    """Honest rows drifting over 10 rounds of one run (one memory), against
    ClippedClustering's probe: the warm-started angle is within the warm bisection's
    precision of the full search's, or beyond it, in at least 95% of the rounds, with
    fewer probe calls."""
    aggregator = defenses.AGGREGATORS["clipped_clustering"]()
    full, warm = attacks.build("clipped_clustering_attack"), attacks.build("clipped_clustering_attack",
                                                                           {"search_every": 10})
    precision = math.pi / warm.grid / 2 / 2 ** warm.warm_steps
    close, cases, calls = 0, 0, {"full": 0, "warm": 0}
    for seed in range(3):
        memory: dict[str, Any] = {}
        drift = torch.randn(40, generator=torch.Generator().manual_seed(100 + seed), dtype=F64) * 0.05
        for round_index in range(10):
            values = instance(seed, 40, 0.8) + round_index * drift
            found = {}
            for name, attack in (("full", full), ("warm", warm)):
                def counted(delivered: torch.Tensor, name: str = name) -> torch.Tensor:
                    calls[name] += round_index > 0
                    return probe(aggregator)(delivered)

                ctx = dataclasses.replace(context(state={"aggregate": counted}), round_index=round_index,
                                          memory=memory if name == "warm" else {})
                found[name] = angle_of(attack(values, ctx), values)
            cases += 1
            close += found["warm"] >= found["full"] - 2 * precision
    assert close >= 0.95 * cases, f"warm within precision in {close} of {cases} rounds"
    assert calls["warm"] <= 0.5 * calls["full"], calls


def test_a_warm_search_from_an_angle_no_longer_kept_falls_back_to_the_full_search():
    values = instance(0, 40, 0.8)
    attack = attacks.build("clipped_clustering_attack", {"search_every": 10})
    key = "clipped_clustering_attack:gradient:angles"
    full = attacks.build("clipped_clustering_attack")(values, context())
    for stale in (math.pi - 0.1, 0.0):  # far out (not kept); 0 (the bracket's upper end is kept)
        ctx = dataclasses.replace(context(), round_index=3, memory={key: torch.tensor(stale, dtype=F64)})
        torch.testing.assert_close(attack(values, ctx), full, rtol=0, atol=1e-12)
