"""The Byzantine attack library (Werner et al.'s large-gradient, bit-flip and label-flip
attacks and the field's standards).

A conformance suite over every registered attack (shapes for ``[S, d]`` and
``[M, S, d]`` messages, dtypes, seeded determinism, no mutation, hostile inputs,
hyperparameter validation, metadata), then one property test per attack's definition:
bit flip (-g), ALIE (Baruch et al. 2019), IPM (Xie et al. 2020), mimic, min-max /
min-sum (Shejwalkar & Houmansadr 2021), ball-edge (Werner et al.), Gaussian noise,
label flip and the ``optimised`` scale search.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
from attacks.statistical import alie_z
from attacks.conformance import check_metadata, identical, messages
from robust_pfl.engine.types import AttackBase, AttackContext, attack_reads_own_rows

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
FAST = settings(max_examples=25, deadline=None)

# Extra configurations exercised by the conformance suite (defaults always are).
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "dba": [{"size": 2, "parts": 2}],
    "model_replacement": [{"boost": 2.0}],
    "fang_krum": [{"centre": "zero"}],
    "optimal_alie": [{"grid": [0.5, 2.0]}],
    "bit_flip": [{"source": "client", "client": 3}, {"source": "client_model", "client": 3}, {"source": "mean", "scale": 2.0}],
    "gaussian_noise": [{"around": "own", "std": 1.0}],
    "alie": [{"z": 1.5}],
    "mimic": [{"client": 2}],
    "min_max": [{"direction": "std"}, {"direction": "sign", "steps": 5}],
    "min_sum": [{"direction": "std"}, {"direction": "sign", "gamma_init": 0.5}],
    "ball_edge": [{"direction": "other_centre"}],
    "neighbour_poison": [{"mode": "flip", "scale": 2.0}, {"direction": "away", "quantile": 0.5}],
    "forged_loss": [{"target": 1, "payload": "large_gradient"}, {"payload": "alie", "payload_options": {"z": 1.0}}],
    "optimised": [{"base": {"name": "gaussian_noise", "std": 3.0}, "scales": [0.5, 2.0]}],
    "label_flip": [{"mode": "pair", "source": 1, "target": 2}],
    "large_gradient": [{"mean": 0.0, "std": 1.0}],
    "constant": [{"value": 1e38}],
}

# One invalid configuration or more per attack with parameters: (options, field named).
INVALID: dict[str, list[tuple[dict[str, Any], str]]] = {
    "clipped_clustering_attack": [({"grid": 0}, "grid"), ({"steps": -1}, "steps"), ({"scale": 0.0}, "scale")],
    "signguard_attack": [({"window": 0}, "window"), ({"scale": -1.0}, "scale"), ({"tiny": 1.0}, "tiny")],
    "badnets": [({"size": 0}, "size"), ({"value": 1.5}, "value"), ({"poison_fraction": 0.0}, "poison_fraction")],
    "dba": [({"parts": 0}, "parts"), ({"size": 2, "parts": 3}, "parts")],
    "model_replacement": [({"boost": 0.0}, "boost")],
    "optimal_alie": [({"grid": []}, "grid"), ({"grid": [1.0, -2.0]}, "grid")],
    "optimal_ipm": [({"grid": [-0.5]}, "grid"), ({"line_evaluations": -1}, "line_evaluations")],
    "fang_krum": [({"f": -1}, "f"), ({"steps": 0}, "steps"), ({"centre": "median"}, "centre")],
    "fang_trimmed_mean": [({"b": 1.0}, "b")],
    "bit_flip": [({"source": "other"}, "source"), ({"client": -1}, "client"), ({"scale": math.inf}, "scale")],
    "gaussian_noise": [({"std": -1.0}, "std"), ({"around": "mean"}, "around")],
    "alie": [({"z": -0.5}, "z"), ({"z": "big"}, "z")],
    "ipm": [({"eps": 0.0}, "eps"), ({"eps": -1.0}, "eps")],
    "mimic": [({"client": -2}, "client"), ({"client": 1.5}, "client")],
    "min_max": [({"direction": "up"}, "direction"), ({"steps": 0}, "steps"), ({"gamma_init": 0.0}, "gamma_init")],
    "min_sum": [({"direction": "up"}, "direction"), ({"steps": True}, "steps")],
    "ball_edge": [({"eps": 1.0}, "eps"), ({"direction": "in"}, "direction"), ({"fallback_quantile": 2.0}, "fallback_quantile")],
    "neighbour_poison": [
        ({"mode": "swap"}, "mode"),
        ({"direction": "up"}, "direction"),
        ({"eps": 1.0}, "eps"),
        ({"quantile": 1.5}, "quantile"),
        ({"scale": 0.0}, "scale"),
    ],
    "forged_loss": [
        ({"target": -1}, "target"),
        ({"target": "smallest"}, "target"),
        ({"payload": "nope"}, "payload"),
        ({"payload_options": {"bogus": 1}}, "payload_options"),
    ],
    "optimised": [({"base": {"name": "nope"}}, "base"), ({"base": "alie"}, "base"), ({"scales": []}, "scales"), ({"scales": [1.0, -2.0]}, "scales")],
    "label_flip": [({"mode": "swap"}, "mode"), ({"mode": "pair", "target": 1}, "source"), ({"shift": 1.5}, "shift")],
    "large_gradient": [({"std": -1.0}, "std"), ({"mean": "abc"}, "mean")],
    "constant": [({"value": "abc"}, "value")],
}

# Attacks whose rows are random draws: a different seed must change the output.
RANDOM = {"large_gradient", "gaussian_noise", "fang_trimmed_mean"}

NAMES = sorted(attacks.REGISTRY)
CONFIGS = [(name, {}) for name in NAMES] + [
    (name, options) for name in NAMES for options in EXAMPLES.get(name, [])
]
CONFIG_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CONFIGS)]

S, D, M = 7, 5, 3
BYZANTINE = torch.tensor([False, True, False, False, True, False, False])


def context(
    byzantine: torch.Tensor = BYZANTINE,
    seed: int = 0,
    senders: torch.Tensor | None = None,
    state: dict[str, Any] | None = None,
    round_index: int = 0,
) -> AttackContext:
    return AttackContext(
        round_index=round_index,
        kind="gradient",
        byzantine=byzantine,
        cluster_ids=torch.zeros(byzantine.shape[0], dtype=torch.long),
        generator=torch.Generator().manual_seed(seed),
        senders=senders,
        defense_state=state or {},
    )


def honest_mean(values: torch.Tensor, byzantine: torch.Tensor = BYZANTINE) -> torch.Tensor:
    return values[..., ~byzantine, :].mean(dim=-2, keepdim=True)


# -- conformance (the public checks of attacks.conformance, over the registry) ----------------
@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    check_metadata(attacks.REGISTRY[name])
    assert attacks.REGISTRY[name].name == name


@pytest.mark.parametrize(("name", "options"), CONFIGS, ids=CONFIG_IDS)
def test_conformance(name, options):
    """Shapes, dtypes, seeded determinism, no mutation, hostile inputs, declared reads
    and the fast paths (attacks.check_attack)."""
    attacks.check_attack(attacks.build(name, options), random=name in RANDOM)


@pytest.mark.parametrize(("name", "options"), CONFIGS, ids=CONFIG_IDS)
def test_an_attack_that_reads_messages_returns_finite_rows_when_everyone_is_byzantine(name, options):
    attack = attacks.build(name, options)
    out = attack(messages(S, D), context(byzantine=torch.ones(S, dtype=torch.bool)))
    assert torch.isfinite(out).all() or not attacks.reads_messages(attack)


@dataclasses.dataclass(frozen=True)
class _Broken(AttackBase):
    """A minimal attack to break one property at a time."""

    name = "broken"
    summary = "copies the first message"
    needs = frozenset()
    fault: str = "none"

    @property
    def reads_messages(self) -> bool:
        return self.fault != "claims_no_reads"

    def __call__(self, values, context):
        rows = int(context.byzantine.sum())
        if self.fault == "mutates":
            values.add_(0.0).mul_(1.0000001)
        if self.fault == "shape":
            rows += 1
        if self.fault == "unseeded":
            return torch.randn(*values.shape[:-2], rows, values.shape[-1], dtype=values.dtype)
        return values[..., :1, :].expand(*values.shape[:-2], rows, values.shape[-1]).clone()


def test_a_well_behaved_attack_of_ones_own_passes():
    attacks.check_attack(_Broken)


@pytest.mark.parametrize(("fault", "named"), [
    ("mutates", "mutated"), ("shape", "shape"), ("unseeded", "same seed"), ("claims_no_reads", "reads_messages"),
])
def test_check_attack_names_the_broken_property(fault, named):
    with pytest.raises(attacks.ConformanceError, match=named):
        attacks.check_attack(_Broken(fault))


def test_bit_flip_reads_its_own_rows_only_from_the_own_source():
    for source, reads in (("own", True), ("client", False), ("client_model", False), ("mean", False)):
        assert attack_reads_own_rows(attacks.build("bit_flip", {"source": source})) is reads
    assert AttackBase.reads_own_rows  # the declared default: it reads


def test_bit_flip_write_from_refuses_the_own_source():
    with pytest.raises(ValueError, match="own"):
        attacks.build("bit_flip").write_from(messages(S, D), messages(2, D), context())


def test_large_noise_blocks_do_not_depend_on_the_thread_count():
    """Blocks above ``_PART_VALUES`` values are drawn in fixed parts on a thread pool:
    the values are the same with 1 and 2 torch threads, and still N(mean, std^2)."""
    from attacks._stats import _PART_VALUES, fill_normal

    draws = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            rows = torch.empty(2, 3, 4 * _PART_VALUES // 3 + 5)  # two blocks of 4 parts and 15 values
            fill_normal(rows, torch.Generator().manual_seed(8), 3.0, 2.0)
            draws.append(rows)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(draws[0], draws[1])
    flat = draws[0].double().flatten()
    assert abs(float(flat.mean()) - 3.0) < 0.01 and abs(float(flat.std()) - 2.0) < 0.01
    assert not torch.equal(draws[0][0], draws[0][1])  # blocks get different values


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_large_noise_blocks_draw_in_a_forked_child():
    """A child forked after the parent used the noise thread pool (a multiprocessing
    grid worker) draws the same values, in its own pool (the child gives up after
    20 s rather than hang the suite)."""
    from attacks._stats import fill_normal

    parent = torch.empty(3, 1 << 20)
    fill_normal(parent, torch.Generator().manual_seed(1), 0.0, 1.0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        signal.alarm(20)
        child = torch.empty(3, 1 << 20)
        fill_normal(child, torch.Generator().manual_seed(1), 0.0, 1.0)
        os._exit(0 if torch.equal(parent, child) else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_reads_messages_follows_the_configuration():
    assert not attacks.reads_messages(attacks.build("gaussian_noise", {"around": "zero"}))
    assert attacks.reads_messages(attacks.build("gaussian_noise", {"around": "own"}))
    assert attacks.reads_messages(attacks.build("bit_flip"))
    assert AttackBase.reads_messages  # the declared default: it reads


def test_every_attack_with_parameters_has_an_invalid_case():
    for name in NAMES:
        if attacks.describe(attacks.REGISTRY[name])["parameters"]:
            assert INVALID.get(name), f"add an invalid-hyperparameter case for {name!r} to INVALID"


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [(name, options, field) for name, cases in INVALID.items() for options, field in cases],
)
def test_invalid_hyperparameters_name_the_field(name, options, field):
    with pytest.raises(ValueError) as info:
        attacks.build(name, options)
    assert f"{name}.{field}" in str(info.value)


@pytest.mark.parametrize(("name", "options", "message"), [
    ("bit_flip", {"scale": True}, "bit_flip.scale must be a finite number, got True"),
    ("bit_flip", {"client": 1.0}, "bit_flip.client must be an integer >= 0, got 1.0"),
    ("ipm", {"eps": math.inf}, "ipm.eps must be a finite number > 0, got inf"),
    ("ball_edge", {"direction": "awya"},
     "ball_edge.direction must be one of ['away', 'other_centre'], got 'awya' (did you mean 'away'?)"),
    ("ball_edge", {"fallback_quantile": math.nan}, "ball_edge.fallback_quantile must be a number in [0, 1], got nan"),
    ("alie", {"z": True}, "alie.z must be a finite number >= 0 or None, got True"),
    ("label_flip", {"shift": "1"}, "label_flip.shift must be an integer, got '1'"),
    ("optimised", {"scales": [1.0, math.inf]}, "optimised.scales must be a non-empty list, each a finite number >= 0"),
    ("forged_loss", {"payload": "bitflip"}, "got 'bitflip' (did you mean 'bit_flip'?)"),
    ("ipm", {"epss": 0.1}, "ipm.epss is not an option (did you mean 'eps'?); attack 'ipm' accepts the fields: eps"),
])
def test_option_errors_name_the_field_what_it_accepts_and_what_was_given(name, options, message):
    """One wording for every attack option (robust_pfl.engine.validation), whether built from
    a config or constructed directly; bools are not numbers."""
    for build in (lambda: attacks.build(name, options), lambda: attacks.REGISTRY[name](**options)):
        with pytest.raises(ValueError) as info:
            build()
        assert message in str(info.value)
        assert type(info.value) is ValueError  # not pydantic's ValidationError


@pytest.mark.parametrize("name", NAMES)
def test_built_in_attacks_stay_frozen_dataclasses(name):
    """Validated by pydantic, still a plain frozen dataclass to everything else: fields
    with plain defaults, equality, hashing, pickling (checkpoints) and replace; every
    option described for ``robust-pfl attacks``."""
    import pickle

    from robust_pfl.engine.registry import init_parameters

    cls = attacks.REGISTRY[name]
    options = dict(EXAMPLES.get(name, [{}])[0])
    attack = cls(**options)
    assert dataclasses.is_dataclass(attack) and cls.__dataclass_params__.frozen
    assert attack == cls(**options) and hash(attack) == hash(cls(**options))
    again = pickle.loads(pickle.dumps(attack))
    assert again == attack and repr(again) == repr(attack)
    assert dataclasses.replace(attack) == attack
    fields = [item for item in dataclasses.fields(cls) if item.init]
    assert init_parameters(cls) == {
        item.name: item.default_factory() if item.default is dataclasses.MISSING else item.default for item in fields
    }
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(attack, fields[0].name, getattr(attack, fields[0].name))
    assert set(attacks.describe(cls)["descriptions"]) == {item.name for item in fields}


def test_unknown_option_is_a_value_error():
    with pytest.raises(ValueError, match="bogus"):
        attacks.build("ipm", {"bogus": 1})


def test_needs_follow_the_configuration():
    assert attacks.BitFlip.needs == {"omniscient"}
    assert attacks.BitFlip().needs == frozenset()
    assert attacks.BitFlip(source="mean").needs == {"omniscient"}
    assert attacks.BitFlip(source="client_model").needs == {"omniscient"}
    assert attacks.Optimised().needs == {"omniscient", "adaptive"}
    assert attacks.Optimised(base={"name": "label_flip"}).needs == {"omniscient", "adaptive", "data"}
    assert attacks.Optimised().attack == attacks.ALIE()


# -- bit flip --------------------------------------------------------------------------------
@st.composite
def problems(draw, min_honest: int = 1):
    """Random leading shape, S, d, Byzantine mask (>= 1 Byzantine, >= min_honest
    honest) and a seed for the values."""
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    s = draw(st.integers(min_honest + 1, 8))
    d = draw(st.integers(1, 6))
    flags = draw(st.lists(st.booleans(), min_size=s, max_size=s))
    byzantine = torch.tensor(flags)
    byzantine[0] = True
    byzantine[1:1 + min_honest] = False
    order = torch.randperm(s, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    byzantine = byzantine[order]
    values = messages(*lead, s, d, seed=draw(st.integers(0, 10_000)))
    return values, byzantine


@FAST
@given(problems())
def test_bit_flip_own_and_mean_are_exactly_minus_g(problem):
    values, byzantine = problem
    own = attacks.BitFlip()(values, context(byzantine))
    assert torch.equal(own, -values[..., byzantine, :])
    mean = attacks.BitFlip(source="mean")(values, context(byzantine))
    torch.testing.assert_close(mean, (-honest_mean(values, byzantine)).expand_as(mean), rtol=1e-14, atol=0)
    scaled = attacks.BitFlip(scale=3.0)(values, context(byzantine))
    torch.testing.assert_close(scaled, -3.0 * values[..., byzantine, :])


def test_bit_flip_client_uses_the_global_index_and_falls_back():
    values = messages(M, S, D)
    senders = torch.tensor([9, 2, 5, 7, 0, 3, 11])  # rows 1 (client 2) and 4 (client 0) Byzantine
    ctx = context(senders=senders)
    rows = lambda client: attacks.BitFlip(source="client", client=client)(values, ctx)  # noqa: E731
    assert torch.equal(rows(5), -values[:, 2:3, :].expand(M, 2, D))  # client 5 is row 2
    # client 0 is Byzantine, client 4 absent: the lowest-index honest sender (3, row 5)
    assert torch.equal(rows(0), -values[:, 5:6, :].expand(M, 2, D))
    assert torch.equal(rows(4), -values[:, 5:6, :].expand(M, 2, D))
    # without senders, rows are clients 0..S-1 and client 0 is honest
    assert torch.equal(attacks.BitFlip(source="client")(values, context()), -values[:, 0:1].expand(M, 2, D))


# -- ALIE, IPM, mimic -------------------------------------------------------------------------
def test_alie_z_matches_the_paper_formula():
    # n = 10, f = 2: s = floor(6) - 2 = 4, z = Phi^-1(6/10)
    assert alie_z(10, 2) == pytest.approx(0.2533471031357997)
    # n = 50, f = 12: s = 26 - 12 = 14, z = Phi^-1(36/50)
    assert alie_z(50, 12) == pytest.approx(0.5828415072712162)
    assert alie_z(4, 4) > 0 and math.isfinite(alie_z(4, 4))  # past a majority: s clamped to 1
    assert alie_z(1, 1) == 0.0


@FAST
@given(problems(min_honest=2), st.sampled_from([None, 0.0, 0.7, 3.0]))
def test_alie_stays_within_z_std_of_the_honest_mean(problem, z):
    values, byzantine = problem
    attack = attacks.ALIE(z=z)
    ctx = context(byzantine)
    out = attack(values, ctx)
    honest = values[..., ~byzantine, :]
    mean, std = honest.mean(-2, keepdim=True), honest.std(-2, keepdim=True)
    used = attack.z_for(ctx)
    assert used == (z if z is not None else alie_z(byzantine.numel(), int(byzantine.sum())))
    assert ((out - mean).abs() <= used * std + 1e-12).all()
    torch.testing.assert_close(out, (mean - used * std).expand_as(out))


@FAST
@given(problems(), st.sampled_from([0.1, 1.0, 4.0]))
def test_ipm_inner_product_is_minus_eps_mean_squared(problem, eps):
    values, byzantine = problem
    out = attacks.IPM(eps=eps)(values, context(byzantine))
    mean = honest_mean(values, byzantine)
    inner = (out * mean).sum(-1)
    expected = (-eps * mean.square().sum(-1)).expand_as(inner)
    torch.testing.assert_close(inner, expected, rtol=1e-10, atol=1e-12)


def test_mimic_copies_the_chosen_honest_row():
    values = messages(M, S, D)
    assert torch.equal(attacks.Mimic()(values, context()), values[:, 0:1].expand(M, 2, D))
    assert torch.equal(attacks.Mimic(client=3)(values, context()), values[:, 3:4].expand(M, 2, D))
    senders = torch.tensor([9, 2, 5, 7, 0, 3, 11])
    assert torch.equal(attacks.Mimic(client=7)(values, context(senders=senders)), values[:, 3:4].expand(M, 2, D))
    # default: the honest sender with the lowest global index (client 3, row 5)
    assert torch.equal(attacks.Mimic()(values, context(senders=senders)), values[:, 5:6].expand(M, 2, D))


# -- min-max / min-sum ------------------------------------------------------------------------
def constraint(name: str, mal: torch.Tensor, honest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(left side, right side) of the Min-Max / Min-Sum constraint per leading block."""
    to_mal = (mal - honest).square().sum(-1)  # [..., H] squared distances (mal is [..., 1, d])
    pair = (honest.unsqueeze(-2) - honest.unsqueeze(-3)).square().sum(-1)  # [..., H, H]
    if name == "min_max":
        return to_mal.amax(dim=-1), pair.amax(dim=(-1, -2))
    return to_mal.sum(dim=-1), pair.sum(-1).amax(-1)


@FAST
@given(problems(min_honest=2), st.sampled_from(["min_max", "min_sum"]), st.sampled_from(["unit", "std", "sign"]))
def test_min_max_and_min_sum_satisfy_their_constraint_tightly(problem, name, direction):
    values, byzantine = problem
    out = attacks.build(name, {"direction": direction})(values, context(byzantine))
    assert torch.equal(out, out[..., :1, :].expand_as(out)), "all Byzantine rows share one vector"
    honest = values[..., ~byzantine, :]
    mean = honest.mean(-2, keepdim=True)
    mal = out[..., :1, :]
    left, right = constraint(name, mal, honest)
    assert (left <= right * (1 + 1e-9) + 1e-12).all()
    step = mal - mean
    active = step.abs().amax(dim=(-1, -2)) > 0
    further, _ = constraint(name, mean + 1.01 * step, honest)
    assert (further[active] > right[active]).all(), "gamma * 1.01 still feasible: search not tight"


def test_min_max_gamma_is_found_beyond_gamma_init():
    """The bracketing search grows gamma past gamma_init when that is feasible."""
    values = messages(S, D) * 100
    out = attacks.MinMax(gamma_init=1e-3)(values, context())
    honest = values[~BYZANTINE]
    left, right = constraint("min_max", out[:1], honest)
    assert left <= right * (1 + 1e-12)
    further, _ = constraint("min_max", honest.mean(0) + 1.01 * (out[:1] - honest.mean(0)), honest)
    assert further > right


# -- ball edge --------------------------------------------------------------------------------
@FAST
@given(problems(), st.integers(1, 3), st.sampled_from(["away", "other_centre"]), st.sampled_from([0.05, 0.5]))
def test_ball_edge_rows_sit_inside_the_ball_of_their_target_centre(problem, k, direction, eps):
    values, byzantine = problem
    lead, d = values.shape[:-2], values.shape[-1]
    centres = messages(*lead, k, d, seed=k)
    radius = torch.rand(*lead, k, dtype=F64, generator=torch.Generator().manual_seed(3)) + 0.1
    state = {"centres": centres, "radius": radius}
    out = attacks.BallEdge(eps=eps, direction=direction)(values, context(byzantine, state=state))
    own = values[..., byzantine, :]
    target = torch.cdist(own, centres).argmin(-1)
    centre = torch.take_along_dim(centres, target.unsqueeze(-1), dim=-2)
    tau = torch.take_along_dim(radius, target, dim=-1)
    distance = (out - centre).norm(dim=-1)
    assert (distance <= tau).all()
    torch.testing.assert_close(distance, (1 - eps) * tau, rtol=1e-9, atol=0)


def test_ball_edge_directions():
    values = messages(S, D)
    mean = honest_mean(values)
    centres = torch.stack([mean[0] + 1.0, mean[0] + 5.0])
    own = values[BYZANTINE]
    state = {"centres": centres, "radius": torch.tensor([2.0, 3.0], dtype=F64)}
    away = attacks.BallEdge()(values, context(state=state))
    target = torch.cdist(own, centres).argmin(-1)
    expected = centres[target] + 0.95 * torch.tensor([2.0, 3.0], dtype=F64)[target, None] * (
        (centres[target] - mean) / (centres[target] - mean).norm(dim=-1, keepdim=True)
    )
    torch.testing.assert_close(away, expected)
    other = attacks.BallEdge(direction="other_centre")(values, context(state=state))
    toward = centres[1 - target] - centres[target]
    expected = centres[target] + 0.95 * torch.tensor([2.0, 3.0], dtype=F64)[target, None] * (
        toward / toward.norm(dim=-1, keepdim=True)
    )
    torch.testing.assert_close(other, expected)


def test_ball_edge_without_state_uses_the_honest_mean_and_a_quantile():
    values = messages(M, S, D)
    mean = honest_mean(values)
    honest = values[:, ~BYZANTINE]
    tau = torch.quantile((honest - mean).norm(dim=-1), 0.3, dim=-1)  # [M]
    out = attacks.BallEdge(fallback_quantile=0.3)(values, context())
    distance = (out - mean).norm(dim=-1)
    torch.testing.assert_close(distance, 0.95 * tau[:, None].expand(M, 2))
    # direction away from the honest mean: the centre is the mean, so -mean
    expected = mean - 0.95 * tau[:, None, None] * mean / mean.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(out, expected.expand(M, 2, D))


def test_ball_edge_uses_the_radius_policy_on_honest_distances():
    values = messages(M, S, D)
    centres = values[:, :1, :] + 0.5  # FC shape [M, 1, d]
    seen = {}

    def policy(distances: torch.Tensor, round_index: int) -> torch.Tensor:
        seen["shape"], seen["round"] = tuple(distances.shape), round_index
        return distances.amax(-1)

    state = {"centres": centres, "radius_policy": policy}
    out = attacks.BallEdge()(values, context(state=state, round_index=4))
    assert seen == {"shape": (M, 1, S - 2), "round": 4}
    tau = (values[:, ~BYZANTINE] - centres).norm(dim=-1).amax(-1)
    torch.testing.assert_close((out - centres).norm(dim=-1), 0.95 * tau[:, None].expand(M, 2))


def test_ball_edge_degenerate_direction_is_a_seeded_unit_vector():
    values = torch.zeros(S, D, dtype=F64)
    state = {"radius": 1.0}
    first = attacks.BallEdge()(values, context(seed=5, state=state))
    again = attacks.BallEdge()(values, context(seed=5, state=state))
    assert identical(first, again)
    torch.testing.assert_close(first.norm(dim=-1), torch.full((2,), 0.95, dtype=F64))


# -- Gaussian noise ---------------------------------------------------------------------------
@pytest.mark.parametrize("around", ["zero", "own"])
def test_gaussian_noise_moments(around):
    d = 20_000
    values = messages(S, d)
    out = attacks.GaussianNoise(std=3.0, around=around)(values, context())
    noise = out - values[BYZANTINE] if around == "own" else out
    assert abs(float(noise.mean())) < 5 * 3.0 / math.sqrt(noise.numel())
    assert float(noise.std()) == pytest.approx(3.0, rel=0.02)


# -- label flip -------------------------------------------------------------------------------
@FAST
@given(st.integers(2, 12), st.integers(-20, 20), st.lists(st.integers(0, 1000), min_size=1, max_size=30))
def test_label_flip_mappings(classes, shift, raw):
    labels = torch.tensor(raw) % classes
    reverse = attacks.LabelFlip()
    flipped = reverse.poison(labels, classes)
    assert torch.equal(flipped, classes - 1 - labels) and flipped.dtype == labels.dtype
    assert torch.equal(reverse.poison(flipped, classes), labels), "reverse is an involution"
    shifted = attacks.LabelFlip(mode="shift", shift=shift).poison(labels, classes)
    assert torch.equal(shifted, (labels + shift) % classes)
    pair = attacks.LabelFlip(mode="pair", source=0, target=classes - 1).poison(labels, classes)
    assert torch.equal(pair[labels != 0], labels[labels != 0])
    assert (pair[labels == 0] == classes - 1).all()


def test_label_flip_rejects_bad_labels_and_sends_honest_rows():
    flip = attacks.LabelFlip()
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        flip.poison(torch.tensor([0, 10]), 10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        flip.poison(torch.tensor([-1, 3]), 10)
    with pytest.raises(ValueError, match="integer"):
        flip.poison(torch.tensor([0.0, 1.0]), 10)
    with pytest.raises(ValueError, match="label_flip.target"):
        attacks.LabelFlip(mode="pair", source=0, target=10).poison(torch.tensor([0, 1]), 10)
    assert torch.equal(flip.poison(torch.tensor([[0, 9], [3, 4]]), 10), torch.tensor([[9, 0], [6, 5]]))
    values = messages(M, S, D)
    assert torch.equal(flip(values, context()), values[:, BYZANTINE])


# -- optimised --------------------------------------------------------------------------------
def median_aggregate(delivered: torch.Tensor) -> torch.Tensor:
    return delivered.median(dim=-2, keepdim=True).values


def damage(values: torch.Tensor, rows: torch.Tensor, aggregate) -> float:
    delivered = values.clone()
    delivered[..., BYZANTINE, :] = rows
    mean = honest_mean(values)
    return float((aggregate(delivered) - mean).norm(dim=-1).mean())


@pytest.mark.parametrize("base", [{"name": "alie"}, {"name": "ipm", "eps": 0.5}, {"name": "bit_flip", "source": "mean"}])
def test_optimised_picks_the_most_damaging_grid_scale(base):
    values = messages(M, S, D, seed=4)
    attack = attacks.Optimised(base=base, line_evaluations=0, refine_evaluations=0)  # the grid alone
    ctx = lambda: context(state={"aggregate": median_aggregate})  # noqa: E731
    out = attack(values, ctx())
    mean = honest_mean(values)
    offset = attack.attack(values, ctx()) - mean
    candidates = [mean + s * offset for s in attack.scales]
    damages = [damage(values, c, median_aggregate) for c in candidates]
    chosen = [i for i, c in enumerate(candidates) if torch.allclose(out, c, rtol=1e-12, atol=1e-12)]
    assert chosen, "output is not one of the grid's scalings of the base rows"
    assert damages[chosen[0]] == pytest.approx(max(damages))
    assert damage(values, out, median_aggregate) >= damage(values, mean + offset, median_aggregate) - 1e-12
    # the full search (grid, line search, refinement) is at least as damaging as its grid
    refined = attacks.Optimised(base=base)(values, ctx())
    assert damage(values, refined, median_aggregate) >= max(damages) - 1e-12


def test_optimised_defaults_to_the_mean_and_survives_non_finite_damage():
    values = messages(S, D)
    attack = attacks.Optimised(base={"name": "ipm"}, scales=[0.5, 2.0, 8.0], line_evaluations=0, refine_evaluations=0)
    mean = honest_mean(values)
    offset = attack.attack(values, context()) - mean
    # plain mean aggregate: damage grows with the scale
    torch.testing.assert_close(attack(values, context()), (mean + 8.0 * offset).expand(2, D))
    nan = {"aggregate": lambda delivered: torch.full_like(delivered[..., :1, :], math.nan)}
    torch.testing.assert_close(attack(values, context(state=nan)), (mean + offset).expand(2, D))
    searched = attacks.Optimised(base={"name": "ipm"}, scales=[0.5, 2.0, 8.0])  # line search, refinement
    torch.testing.assert_close(searched(values, context(state=nan)), (mean + offset).expand(2, D))
    assert bool(((searched(values, context()) - mean).norm(dim=-1) >= 1e4 * (8.0 * offset).norm(dim=-1)).all())


def test_an_attack_must_subclass_the_declared_contract():
    """Registration and the federation refuse an attack that does not subclass
    AttackBase, naming it: the engine reads declared attributes, not guesses."""

    @dataclasses.dataclass(frozen=True)
    class Undeclared:
        name = "undeclared_test"
        summary = "no base class"
        needs = frozenset()

        def __call__(self, messages, context):
            return messages[..., :1, :]

    with pytest.raises(TypeError, match="undeclared_test.*AttackBase"):
        attacks.register(Undeclared)
    from robust_pfl.engine.tasks import SyntheticLinearRegression
    from robust_pfl.engine.federation import Federation

    task = SyntheticLinearRegression(clusters=2, clients_per_cluster=2).build(0, byzantine_total=1)
    with pytest.raises(TypeError, match="AttackBase.*got Undeclared"):
        Federation(task.objective, task.train, task.cluster_ids, task.byzantine, 0, None, Undeclared())


def test_an_attack_without_a_call_or_a_name_is_refused_where_it_is_registered():
    """The contract is declared: ``__call__`` is abstract, ``name`` and ``summary``
    required; registering a class that misses one fails at its definition."""

    @dataclasses.dataclass(frozen=True)
    class NoCall(AttackBase):
        name, summary = "no_call", "forgets __call__"

    with pytest.raises(TypeError, match="does not implement __call__"):
        attacks.register(NoCall)

    @dataclasses.dataclass(frozen=True)
    class NoName(AttackBase):
        summary = "forgets its name"

        def __call__(self, messages, context):
            return messages

    with pytest.raises(TypeError, match="'name'"):
        attacks.register(NoName)
    assert "no_call" not in attacks.REGISTRY
