"""MC, PFL-TC, FC, IFCA and CFL publish their assignment of clients to centres
(``defense_state["assignment"]``, robust_pfl.engine.defense_state) and it says what the
state reference says: on a well-separated hand-made instance, the honest clients of
one true cluster share one index and the two clusters differ; the value equals the
algorithm's own rule (the nearest centre, the ball, the lowest reported loss, the
cluster after last round's splits) at the step the reference names; Byzantine rows
are assigned by the rows delivered for them.  ``check_algorithm`` fails an algorithm
that declares an assignment and does not publish it, or publishes one out of range."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor

import defenses
from defenses.clustering_algorithms import ALG4_PRINTED_RULES, MomentumClustering
from defenses.ifca import IFCA
from robust_pfl.engine.conformance import ConformanceError
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.rows import euclidean_distances
from robust_pfl.engine.tasks import SyntheticLinearRegression
from robust_pfl.engine.types import AttackBase, AttackContext, RoundRecord

pytestmark = pytest.mark.usefixtures("single_thread")

ROUNDS = 4
SAMPLES = 200  # per client, every one in each batch: a client's gradient is its cluster's up to little noise
TASK = SyntheticLinearRegression(clusters=2, clients_per_cluster=3, dim=5, samples_per_client=SAMPLES,
                                 validation_samples=4, test_samples=4, scale=10.0)


@dataclasses.dataclass(frozen=True)
class Recorder(AttackBase):
    """Keeps every delivery (its kind, round, messages, receivers, senders and a copy
    of the published state) and sends the Byzantine clients' honest rows, or with
    ``copy_client`` that client's row for every Byzantine sender; loss reports are
    forged to pick model ``forged_model`` when it is set."""

    name: ClassVar[str] = "test_assignment_recorder"
    summary: ClassVar[str] = "records what the defense publishes"
    needs: ClassVar[frozenset[str]] = frozenset({"adaptive"})
    forges_losses: ClassVar[bool] = True
    copy_client: int | None = None
    forged_model: int | None = None
    seen: list[dict[str, Any]] = dataclasses.field(default_factory=list, compare=False, hash=False)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        state = {key: value.clone() if isinstance(value, Tensor) else value
                 for key, value in context.defense_state.items()}
        self.seen.append({"kind": context.kind, "round": context.round_index, "messages": messages.clone(),
                          "receivers": context.receivers, "senders": context.senders, "state": state})
        rows = messages[..., context.byzantine, :].clone()
        if context.kind == "loss" and self.forged_model is not None:
            rows = torch.ones_like(rows)
            rows[..., self.forged_model] = 0.0
        elif context.kind != "loss" and self.copy_client is not None:
            rows[...] = messages[..., self.copy_client : self.copy_client + 1, :]
        return rows

    def deliveries(self, kind: str) -> list[dict[str, Any]]:
        return [item for item in self.seen if item["kind"] == kind]


def run(name: str, options: dict[str, Any], attack: Recorder, **extra: Any) -> tuple[Federation, list[RoundRecord]]:
    """``ROUNDS`` rounds of algorithm ``name`` on the well-separated instance: 2 true
    clusters of 3 honest clients and 1 Byzantine each, every client's whole data as its
    batch."""
    task = TASK.build(0, byzantine_total=2)
    federation = Federation(task.objective, task.train, task.cluster_ids, task.byzantine, 0, SAMPLES, attack)
    cls = defenses.REGISTRY[name]
    algorithm = cls(federation, cls.Params(**{"lr": 0.01, **options}), **extra)
    return federation, [algorithm.step(t) for t in range(ROUNDS)]


def assert_separates(assignment: Tensor, federation: Federation, rows: Tensor | None = None) -> None:
    """The clients ``rows`` (default: the honest ones) of each true cluster share one
    index, and the two clusters' indices differ."""
    rows = (~federation.byzantine).nonzero().squeeze(-1) if rows is None else rows
    first, second = (rows[federation.cluster_ids[rows] == cluster] for cluster in (0, 1))
    assert len(set(assignment[first].tolist())) == 1 and len(set(assignment[second].tolist())) == 1, assignment
    assert int(assignment[first[0]]) != int(assignment[second[0]]), assignment


@pytest.mark.parametrize(("name", "options"), [
    ("mc", {"alpha": 1.0, **ALG4_PRINTED_RULES}),
    ("pfl_tc", {"local_steps": 1}),
], ids=["mc", "pfl_tc"])
def test_server_clustering_publishes_last_rounds_nearest_centre(name, options):
    """None in round 0; in round t, the record's assignment of round t - 1, which is
    every delivered row's nearest published centre (the Byzantine client of cluster 1,
    sending client 0's row, is on client 0's centre)."""
    attack = Recorder(copy_client=0)
    federation, records = run(name, options, attack)
    deliveries = attack.deliveries("momentum")
    assert [item["round"] for item in deliveries] == list(range(ROUNDS))
    assert deliveries[0]["state"]["assignment"] is None
    byzantine = federation.byzantine.nonzero().squeeze(-1)
    for previous, item in zip(deliveries, deliveries[1:]):
        assignment, centres = item["state"]["assignment"], item["state"]["centres"]
        assert assignment.dtype == torch.int64 and tuple(assignment.shape) == (federation.clients,)
        assert torch.equal(assignment, records[item["round"] - 1].assignment)
        delivered = previous["messages"].clone()
        delivered[byzantine] = previous["messages"][0]
        assert torch.equal(assignment, euclidean_distances(delivered, centres).argmin(-1))
        assert_separates(assignment, federation)
        assert (assignment[byzantine] == assignment[0]).all()


@pytest.mark.parametrize("groups", [1, 2])
def test_fc_publishes_last_rounds_balls(groups):
    """None in round 0; then ``[R, N]``: 0 exactly for the senders of the receiver's
    true cluster (Byzantine ones included, sending honest rows) with one group; with
    two, -1 for every client outside the receiver's subgroup of the round before and 0
    for the receiver itself."""
    attack = Recorder()
    federation, _ = run("fc", {"groups": groups, "radius": {"policy": "quantile", "q": 0.5}}, attack)
    deliveries = attack.deliveries("cross_gradient")
    last_group: dict[int, set[int]] = {}
    for item in deliveries:
        receivers, senders, assignment = item["receivers"], item["senders"], item["state"]["assignment"]
        if item["round"] == 0:
            assert assignment is None
        else:
            assert assignment.dtype == torch.int64 and tuple(assignment.shape) == (receivers.numel(), federation.clients)
            assert set(assignment.unique().tolist()) <= {-1, 0}
            for row, receiver in zip(assignment, receivers.tolist()):
                assert int(row[receiver]) == 0
                if groups == 1:
                    same = federation.cluster_ids == federation.cluster_ids[receiver]
                    assert torch.equal(row == 0, same), (receiver, row)
                else:
                    outside = [j for j in range(federation.clients) if j not in last_group[receiver]]
                    assert (row[outside] == -1).all(), (receiver, row)
        for receiver in receivers.tolist():  # each receiver is in one delivery a round
            last_group[receiver] = set(senders.tolist())


def test_ifca_publishes_last_rounds_choice_then_this_rounds():
    """At the loss reports, the choice of the round before (all 0 in round 0); at the
    gradients, the lowest reported loss of this round, forged reports included: the
    Byzantine clients, forging model 0, are on model 0, the honest ones on their
    cluster's model (the models start near the optima, swapped)."""
    task = TASK.build(0, byzantine_total=2)
    attack = Recorder(forged_model=0)
    federation, records = run("ifca", {}, attack, initial_models=task.optima.flip(0) + 1.0)
    reports, gradients = attack.deliveries("loss"), attack.deliveries("gradient")
    assert len(reports) == len(gradients) == ROUNDS
    byzantine = federation.byzantine
    for t, (report, gradient) in enumerate(zip(reports, gradients)):
        before, chosen = report["state"]["assignment"], gradient["state"]["assignment"]
        expected_before = torch.zeros_like(before) if t == 0 else gradients[t - 1]["state"]["assignment"]
        assert torch.equal(before, expected_before)
        reported = report["messages"].clone()
        reported[byzantine] = 1.0
        reported[byzantine, 0] = 0.0
        assert torch.equal(chosen, reported.argmin(-1))
        assert torch.equal(chosen, records[t].assignment)
        assert (chosen[byzantine] == 0).all()
        assert_separates(chosen, federation)
        assert int(chosen[0]) == 1  # cluster 0 starts next to optimum 0, at model 1


def test_cfl_publishes_the_clusters_after_last_rounds_splits():
    """All 0 until a split; after the split of round 1 (into the true clusters),
    round 2's delivery carries the record's post-split assignment, Byzantine clients
    (sending honest rows) with their clusters."""
    attack = Recorder()
    federation, records = run("cfl", {"split_after": 1, "eps1": 1e9, "eps2": 0.0, "max_clusters": 2}, attack)
    assert records[1].extras["splits"] == [(0, 1)]
    deliveries = attack.deliveries("gradient")
    for item in deliveries[:2]:
        assert torch.equal(item["state"]["assignment"], torch.zeros(federation.clients, dtype=torch.long))
    for item in deliveries[2:]:
        assignment = item["state"]["assignment"]
        assert torch.equal(assignment, records[item["round"] - 1].assignment)
        assert_separates(assignment, federation, torch.arange(federation.clients))


# -- check_algorithm ---------------------------------------------------------------------------
class Unpublished(MomentumClustering):
    """MC declaring its state as ever but leaving the assignment out."""

    def _defense_state(self) -> dict[str, Any]:
        return {key: value for key, value in super()._defense_state().items() if key != "assignment"}


class OutOfRange(MomentumClustering):
    """MC publishing an assignment past its K centres."""

    def _defense_state(self) -> dict[str, Any]:
        state = super()._defense_state()
        if state["assignment"] is not None:
            state["assignment"] = state["assignment"] + self.k
        return state


class UnpublishedIFCA(IFCA):
    def _defense_state(self) -> dict[str, Any]:
        return {key: value for key, value in super()._defense_state().items() if key != "assignment"}


@pytest.mark.parametrize("cls", [Unpublished, UnpublishedIFCA], ids=["mc", "ifca"])
def test_check_algorithm_fails_a_declared_assignment_left_unpublished(cls):
    with pytest.raises(ConformanceError, match=r"declared, not published: \['assignment'\]"):
        defenses.check_algorithm(cls)


def test_check_algorithm_fails_an_assignment_out_of_range():
    with pytest.raises(ConformanceError, match=r"assignment: values outside \[0, K\)"):
        defenses.check_algorithm(OutOfRange)


def test_check_algorithm_holds_fcs_assignment_to_its_declared_range():
    """FC's -1 ("outside the ball") is declared; declared from 0, the run breaks it."""
    fc = defenses.REGISTRY["fc"]
    declared = fc.published_state
    keys = tuple(dataclasses.replace(key, lowest=0) if key.name == "assignment" else key
                 for key in declared.deliveries[0].keys)
    narrowed = dataclasses.replace(declared, deliveries=(dataclasses.replace(declared.deliveries[0], keys=keys),))
    cls = type("NarrowedFC", (fc,), {"published_state": narrowed})
    with pytest.raises(ConformanceError, match=r"assignment: values outside \[0, 1\)"):
        defenses.check_algorithm(cls, {"radius": {"policy": "quantile", "q": 0.5}})
