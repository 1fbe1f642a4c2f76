"""attacks.check_attack exercises an attack's adaptive path: it hands the attack the
declared defense_state of every built-in defense (round 0 with MC's centres None, FC's
[R, 1, d] centres with receivers and senders), and names the key and the defense when
an attack reads a key a defense does not publish, misuses a shape or writes into the
state.  One ConformanceError class serves attacks and defenses."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch

import attacks
import defenses
from attacks.conformance import check_defense_states
from robust_pfl.engine import defense_state
from robust_pfl.engine.types import AttackBase


@dataclasses.dataclass(frozen=True)
class _Adaptive(AttackBase):
    """A plug-in-style adaptive attack: every Byzantine row is the first published
    centre (``fault`` breaks one thing at a time)."""

    name: ClassVar[str] = "plugin_first_centre"
    summary: ClassVar[str] = "the first published centre, else the honest mean"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient", "adaptive"})
    fault: str = "none"

    def __call__(self, messages: torch.Tensor, context: Any) -> torch.Tensor:
        lead, rows, d = messages.shape[:-2], int(context.byzantine.sum()), messages.shape[-1]
        if self.fault == "unguarded":  # neither absent nor None foreseen
            first = context.defense_state["centres"][..., :1, :]
            return first.to(messages.dtype).expand(*lead, rows, d).clone()
        centres = context.defense_state.get("centres")
        if centres is None:
            honest = torch.nan_to_num(messages[..., ~context.byzantine, :])
            first = honest.mean(dim=-2, keepdim=True) if honest.shape[-2] else messages.new_zeros(*lead, 1, d)
        elif self.fault == "flat_centres":  # takes the centres for [K, d] whatever the defense
            return centres.reshape(-1, d)[:1].to(messages.dtype).expand(rows, d).clone()
        else:
            first = centres[..., :1, :].to(messages.dtype).expand(*lead, 1, d)
            if self.fault == "writes":
                centres.add_(1.0)
        return first.expand(*lead, rows, d).clone()


def test_an_unguarded_centres_read_fails_naming_the_key_and_the_defense():
    with pytest.raises(attacks.ConformanceError, match=r"reads defense_state\['centres'\], which local does not publish"):
        attacks.check_attack(_Adaptive("unguarded"))


def test_an_unguarded_read_fails_on_mcs_round_0_none_naming_the_key_and_the_defense():
    """Against FC (which always publishes centres) the unguarded read passes; against
    MC it fails in round 0, where the centres are None."""
    check_defense_states(_Adaptive("unguarded"), (defense_state.FC,))
    with pytest.raises(attacks.ConformanceError,
                       match=r"mc, myopic, pfl_tc \(momentum deliveries, round 0\), having read centres \[K, d\], "
                             r"None in round 0: TypeError"):
        check_defense_states(_Adaptive("unguarded"), (defense_state.SERVER_CLUSTERING,))


def test_a_shape_misuse_is_named_with_the_defense_and_the_key_read():
    check_defense_states(_Adaptive("flat_centres"), (defense_state.SERVER_CLUSTERING,))  # [K, d]: right there
    with pytest.raises(attacks.ConformanceError,
                       match=r"returned shape \(2, 5\) on the defense_state of fc \(cross_gradient deliveries, "
                             r"round 0\), expected \(3, 2, 5\), having read centres \[R, 1, d\]"):
        check_defense_states(_Adaptive("flat_centres"), (defense_state.FC,))


def test_writing_into_the_state_is_named():
    with pytest.raises(attacks.ConformanceError, match=r"wrote into defense_state\['centres'\] of the defense_state of fc"):
        check_defense_states(_Adaptive("writes"), (defense_state.FC,))


def test_a_correct_adaptive_attack_passes():
    attacks.check_attack(_Adaptive())


@pytest.mark.parametrize("name, options", [
    ("ball_edge", {}), ("ball_edge", {"direction": "other_centre"}), ("neighbour_poison", {}),
    ("bit_flip", {"source": "client_model"}), ("optimised", {}), ("clipped_clustering_attack", {}),
])
def test_built_in_adaptive_attacks_pass(name, options):
    attack = attacks.build(name, options)
    check_defense_states(attack)


@dataclasses.dataclass(frozen=True)
class _Spy(AttackBase):
    """Records what check_attack hands it: (defense, kind, round, centres shape or
    None or absent, receivers, senders)."""

    name: ClassVar[str] = "spy"
    summary: ClassVar[str] = "records its contexts"
    forges_losses: ClassVar[bool] = True
    seen: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def __call__(self, messages: torch.Tensor, context: Any) -> torch.Tensor:
        state = context.defense_state
        centres = tuple(state["centres"].shape) if state.get("centres") is not None else (
            "None" if "centres" in state else "absent")
        self.seen.append((context.kind, context.round_index, centres,
                          None if context.receivers is None else tuple(context.receivers.shape),
                          None if context.senders is None else tuple(context.senders.shape), tuple(messages.shape)))
        return messages[..., context.byzantine, :].clone()


def test_the_states_handed_over_have_the_declared_shapes_round_0_nones_and_every_kind():
    spy = _Spy()
    check_defense_states(spy)
    seen = set(spy.seen)
    assert ("cross_gradient", 0, (3, 1, 5), (3,), (7,), (3, 7, 5)) in seen  # FC: [R, 1, d], receivers, senders
    assert ("momentum", 0, "None", None, None, (7, 5)) in seen  # MC's round 0
    assert ("momentum", 1, (2, 5), None, None, (7, 5)) in seen  # MC later: [K, d]
    assert ("model", 1, (3, 2, 5), (3,), None, (3, 7, 5)) in seen  # FedSPD: [R, K, d]
    assert ("gradient", 0, "absent", None, None, (7, 5)) in seen  # Global, Local
    assert ("loss", 0, "absent", None, None, (7, 2)) in seen  # reports [S, K], to a loss-forging attack
    assert {kind for kind, *_ in seen} == {"gradient", "momentum", "cross_gradient", "model", "loss"}


def test_loss_reports_go_only_to_attacks_that_forge_losses():
    spy = type("NoForge", (_Spy,), {"forges_losses": False})()
    check_defense_states(spy)
    assert "loss" not in {kind for kind, *_ in spy.seen}


# -- one ConformanceError ----------------------------------------------------------------------
def test_defenses_exports_the_conformance_error_attacks_does():
    from defenses import ConformanceError

    assert ConformanceError is attacks.ConformanceError and "ConformanceError" in defenses.__all__


@dataclasses.dataclass(frozen=True)
class _Unseeded(defenses.Aggregator):
    """The mean plus noise from torch's global stream, not the generator handed over."""

    name: ClassVar[str] = "plugin_unseeded"
    summary: ClassVar[str] = "the mean plus unseeded noise"

    def aggregate_rows(self, rows, previous, generator):
        mean = rows.values.sum(-2) / rows.count.clamp_min(1).unsqueeze(-1).to(rows.values.dtype)
        return mean + torch.randn(mean.shape, dtype=mean.dtype)


def test_check_aggregator_raises_the_exported_error():
    with pytest.raises(defenses.ConformanceError, match="_Unseeded"):
        defenses.check_aggregator(_Unseeded())
