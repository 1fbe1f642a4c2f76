"""The forged-loss-report attack (``forged_loss``) against loss-based clustering.

IFCA and CLoVE assign a client from the losses it reports.  Properties: the forged
report is exactly the mean of the honest reports that choose the target (by hand);
every other message kind is the payload attack's; under CLoVE and IFCA every
Byzantine client lands in the target cluster in every round; and the payload then
damages the target cluster's model more than the same payload without forged
reports (which stays in the Byzantine clients' own cluster).  Only an attack that
declares ``forges_losses`` changes loss reports.
"""

from __future__ import annotations

import math

import pytest
import torch

import attacks
import defenses
from robust_pfl import Federation
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.tasks.images import ImageTask
from robust_pfl.engine.types import AttackBase, AttackContext

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def context(byzantine, kind="loss", seed=0):
    return AttackContext(round_index=0, kind=kind, byzantine=torch.tensor(byzantine),
                         cluster_ids=torch.zeros(len(byzantine), dtype=torch.long),
                         generator=torch.Generator().manual_seed(seed))


# -- construction ---------------------------------------------------------------------------
@pytest.mark.parametrize("options, field", [
    ({"target": -1}, "target"),
    ({"target": "smallest"}, "target"),
    ({"target": 1.5}, "target"),
    ({"target": True}, "target"),
    ({"payload": "nope"}, "payload"),
    ({"payload": "forged_loss"}, "payload"),
    ({"payload": "label_flip"}, "payload"),
    ({"payload": "optimised", "payload_options": {"base": {"name": "label_flip"}}}, "payload"),
    ({"payload_options": {"bogus": 1}}, "payload_options"),
    ({"payload": "bit_flip", "payload_options": {"source": "nowhere"}}, "payload_options"),
    ({"payload_options": [1]}, "payload_options"),
])
def test_invalid_options_name_the_field(options, field):
    with pytest.raises(ValueError) as info:
        attacks.build("forged_loss", options)
    assert f"forged_loss.{field}" in str(info.value)


def test_metadata_and_needs():
    attack = attacks.build("forged_loss")
    assert attack.forges_losses and attacks.ForgedLoss.forges_losses
    assert attack.payload == "bit_flip" and attack.needs == {"omniscient"}
    assert attacks.build("forged_loss", {"payload": "optimised"}).needs == {"omniscient", "adaptive"}
    assert "forged_loss" in attacks.REGISTRY


# -- the forged report by hand ----------------------------------------------------------------
HONEST = [[1.0, 3.0, 5.0], [2.0, 1.0, 6.0], [3.0, 2.0, 9.0], [4.0, 5.0, 1.0], [6.0, 2.0, 8.0]]
BYZ = [False, False, False, False, False, True, True]


def reports(*extra):
    return torch.tensor(HONEST + [[0.0, 0.0, 0.0]] * 2 + list(extra), dtype=F64)


def test_forged_report_is_the_mean_of_the_reports_choosing_the_target():
    # honest argmins: 0, 1, 1, 2, 1 -> model 1 is chosen by clients 1, 2, 4
    mean_of_1 = torch.tensor([11.0 / 3, 5.0 / 3, 23.0 / 3], dtype=F64)
    out = attacks.build("forged_loss", {"target": 1})(reports(), context(BYZ))
    torch.testing.assert_close(out, mean_of_1.expand(2, 3))
    largest = attacks.build("forged_loss")(reports(), context(BYZ))  # "largest": model 1 (3 of 5)
    torch.testing.assert_close(largest, out)
    only = attacks.build("forged_loss", {"target": 2})(reports(), context(BYZ))
    torch.testing.assert_close(only, torch.tensor([[4.0, 5.0, 1.0]] * 2, dtype=F64))


def test_forged_report_fallbacks():
    # nobody chooses model 2 when client 3 is gone: honest mean, entry 2 below the lowest entry
    honest = torch.tensor([row for i, row in enumerate(HONEST) if i != 3] + [[0.0] * 3] * 2, dtype=F64)
    out = attacks.build("forged_loss", {"target": 2})(honest, context([False] * 4 + [True] * 2))
    expected = torch.tensor([3.0, 2.0, 1.0], dtype=F64)
    torch.testing.assert_close(out, expected.expand(2, 3))
    assert (out.argmin(-1) == 2).all()
    # a tie at the target is broken in its favour
    tied = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=F64)
    forged = attacks.build("forged_loss", {"target": 1})(tied, context([False, True]))
    assert int(forged.argmin(-1)) == 1 and float(forged[0, 0]) == 1.0
    # no finite honest report: 1 everywhere, 0 at the target
    hostile = torch.tensor([[math.nan, 1.0, 2.0], [math.inf, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    out = attacks.build("forged_loss", {"target": 2})(hostile, context([False, False, True]))
    assert out.tolist() == [[1.0, 1.0, 0.0]]
    # non-finite honest rows are ignored, leading blocks are forged independently
    mixed = torch.stack([reports(), reports().flip(-1)])
    mixed[0, 0, 0] = math.nan
    out = attacks.build("forged_loss", {"target": 1})(mixed, context(BYZ))
    assert out.shape == (2, 2, 3) and torch.isfinite(out).all()
    assert (out.argmin(-1) == 1).all()


def test_a_target_beyond_the_models_is_an_error():
    with pytest.raises(ValueError, match="forged_loss.target"):
        attacks.build("forged_loss", {"target": 3})(reports(), context(BYZ))


def test_other_kinds_are_the_payloads_rows():
    values = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(1), dtype=F64)
    for payload, options in [("bit_flip", {}), ("large_gradient", {"mean": 3.0}), ("alie", {"z": 1.0})]:
        forged = attacks.build("forged_loss", {"payload": payload, "payload_options": options})
        plain = attacks.build(payload, options)
        for kind in ("gradient", "model", "cross_gradient", "momentum"):
            assert torch.equal(forged(values, context(BYZ, kind, seed=4)), plain(values, context(BYZ, kind, seed=4)))


# -- in a federation ----------------------------------------------------------------------------
class Spy(AttackBase):
    """A gradient attack (no ``forges_losses``) that records the kinds it is asked for."""

    def __init__(self) -> None:
        self.kinds = []

    def __call__(self, messages, context):
        self.kinds.append(context.kind)
        return -messages[..., context.byzantine, :]


def digits_task():
    """Digits, private label, 4 clusters of 5 honest clients, 2 Byzantine clients
    holding cluster 0's data."""
    spec = ImageTask(dataset="digits", kind="private_label", clusters=4, clients_per_cluster=5,
                     model={"name": "mlp", "hidden": [32]})
    return spec.build(0, placement=ByzantinePlacement(total=2, clusters=(0,)))


def federation(task, attack=None) -> Federation:
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, 0, 16, attack,
                      num_classes=task.num_classes)


@pytest.fixture(scope="module")
def warm():
    """Models of an honest CLoVE run of 5 rounds (the clusters are found by then) and
    the model each true cluster uses: every run below starts from them, so that
    model ``t`` is cluster ``c``'s model from the first round."""
    task = digits_task()
    algo = defenses.build("clove", federation(task), {"lr": 0.1, "heavy_ball": 0.9})
    for t in range(5):
        record = algo.step(t)
    honest = ~task.byzantine
    model_of = {c: int(record.assignment[honest & (task.cluster_ids == c)][0]) for c in range(4)}
    assert sorted(model_of.values()) == [0, 1, 2, 3]
    return task, algo.models.clone(), model_of


def test_gradient_attacks_never_see_loss_reports(warm):
    task, models, _ = warm
    spy = Spy()
    algo = defenses.REGISTRY["clove"](federation(task, spy), defenses.REGISTRY["clove"].Params(lr=0.1),
                                      initial_models=models)
    algo.step(0)
    assert spy.kinds == ["model"]


METHODS = [
    ("clove", {}),
    ("clove", {"aggregation": "gradient"}),
    ("clove", {"embedding": "sqrt_loss", "clustering": "agglomerative"}),
    ("ifca", {}),
    ("ifca_model_avg", {}),
    ("hypcluster", {}),
]


@pytest.mark.parametrize("name, options", METHODS)
def test_forged_reports_put_every_byzantine_client_in_the_target_cluster_and_poison_it(warm, name, options):
    """The Byzantine clients hold cluster 0's data; the target is cluster 2's model.
    With forged reports they are assigned the target model in every round, and the
    bit-flip payload then costs cluster 2 accuracy; the same payload without forged
    reports stays in cluster 0 (the Byzantine clients' own model) and leaves cluster
    2 as accurate as it was."""
    task, models, model_of = warm
    target, victim = model_of[2], task.cluster_ids == 2
    honest = ~task.byzantine
    accuracy = {}
    for forged in (True, False):
        attack = attacks.build("forged_loss", {"target": target}) if forged else attacks.build("bit_flip")
        cls = defenses.REGISTRY[name]
        algo = cls(federation(task, attack), cls.Params(lr=0.1, heavy_ball=0.9, **options), initial_models=models)
        for t in range(15):
            record = algo.step(t)
            placed = record.assignment[task.byzantine]
            if forged:
                assert (placed == target).all(), (t, placed.tolist())
            else:
                assert (placed == model_of[0]).all(), (t, placed.tolist())
        per_client = task.evaluate(algo.client_models())["test_accuracy"]
        accuracy[forged] = float(per_client[honest & victim].mean())
    assert accuracy[False] > 0.8, accuracy
    assert accuracy[True] < accuracy[False] - 0.2, accuracy
