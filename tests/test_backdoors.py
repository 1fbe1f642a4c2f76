"""Backdoor attacks (:mod:`attacks.backdoor`): BadNets, DBA, model replacement, and the
attack success rate (ASR) the engine records beside the test accuracy.

The end-to-end tests train undefended Global (FedAvg with the mean) on the embedded
digits, 4 rotation clusters of 10 honest clients plus 4 Byzantine ones, 100 rounds
(a few seconds on one CPU core each)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
import attacks.backdoor  # registers badnets, dba and model_replacement
from attacks.backdoor import DBA, BadNets, ModelReplacement
from robust_pfl.cli import main
from robust_pfl.config import parse_config
from robust_pfl.experiments import RunParts, run_experiment
from robust_pfl.engine.metrics import attack_success_rate
from robust_pfl.summaries import summary_table
from robust_pfl.engine.tasks.transforms import normalization_stats


def config(attack: dict, byzantine: int = 4, rounds: int = 100, seeds: tuple[int, ...] = (0,)):
    return parse_config({
        "seeds": list(seeds), "rounds": rounds, "eval_every": 50, "batch_size": 16,
        "task": {"name": "image", "dataset": "digits", "kind": "rotation", "clusters": 4,
                 "clients_per_cluster": 10},
        "byzantine": {"total": byzantine},
        "attack": attack,
        "methods": [{"name": "global", "aggregator": "mean", "lr": 0.1, "heavy_ball": 0.9}],
    })


def final(attack: dict, byzantine: int = 4) -> dict[str, float]:
    out = run_experiment(config(attack, byzantine), progress=False)
    return {name: values["mean"] for name, values in out["final"]["global"].items()}


# -- options -----------------------------------------------------------------------------------
def test_registered_and_conformant():
    for cls in (BadNets, DBA, ModelReplacement):
        assert attacks.REGISTRY[cls.name] is cls
        assert cls.needs == {"data"}
        attacks.check_attack(cls)


def test_conformance_checks_the_backdoor_hooks():
    """``attacks.check_attack`` checks a backdoor's declared hooks (BackdoorAttack):
    an unimplemented hook, a target check that accepts every class, labels set to
    another class, and hooks defined outside the contract are all named."""
    from dataclasses import dataclass
    from typing import ClassVar

    from robust_pfl.engine.conformance import ConformanceError
    from robust_pfl.engine.types import AttackBase, BackdoorAttack

    @dataclass(frozen=True)
    class Partial(BackdoorAttack):
        name: ClassVar[str] = "partial_backdoor"
        summary: ClassVar[str] = "a backdoor without its hooks"
        target: int = 0

        def __call__(self, messages, context):
            return messages[..., context.byzantine, :].clone()

    with pytest.raises(ConformanceError, match="abstract.*poison_samples"):
        attacks.check_attack(Partial)

    @dataclass(frozen=True)
    class LaxTarget(BadNets):
        name: ClassVar[str] = "lax_target"

        def check_target(self, num_classes):
            pass

    with pytest.raises(ConformanceError, match="accepted target"):
        attacks.check_attack(LaxTarget)

    @dataclass(frozen=True)
    class WrongLabels(BadNets):
        name: ClassVar[str] = "wrong_labels"

        def poison_samples(self, inputs, targets, num_classes, stats, generator):
            stamped, labels = super().poison_samples(inputs, targets, num_classes, stats, generator)
            return stamped, labels + 1

    with pytest.raises(ConformanceError, match="keep a label or set it to target"):
        attacks.check_attack(WrongLabels)

    @dataclass(frozen=True)
    class Undeclared(AttackBase):
        name: ClassVar[str] = "undeclared_backdoor"
        summary: ClassVar[str] = "backdoor hooks outside the contract"
        needs: ClassVar[frozenset[str]] = frozenset({"data"})

        def stamp_trigger(self, inputs, stats=None):
            return inputs.clone()

        def poison_samples(self, inputs, targets, num_classes, stats, generator):
            return inputs.clone(), targets.clone()

        def __call__(self, messages, context):
            return messages[..., context.byzantine, :].clone()

    with pytest.raises(ConformanceError, match="does not subclass BackdoorAttack"):
        attacks.check_attack(Undeclared)


@pytest.mark.parametrize("cls, options, field", [
    (BadNets, {"size": 0}, "badnets.size"),
    (BadNets, {"value": 1.5}, "badnets.value"),
    (BadNets, {"poison_fraction": 0.0}, "badnets.poison_fraction"),
    (BadNets, {"target": -1}, "badnets.target"),
    (DBA, {"parts": 0}, "dba.parts"),
    (DBA, {"size": 2, "parts": 3}, "dba.parts"),
    (ModelReplacement, {"boost": -2.0}, "model_replacement.boost"),
    (ModelReplacement, {"margin": -1}, "model_replacement.margin"),
])
def test_bad_options_name_the_field(cls, options, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        cls(**options)


def test_trigger_that_does_not_fit_or_target_outside_classes_is_refused():
    with pytest.raises(ValueError, match=r"badnets\.size"):
        BadNets(size=8, margin=1).trigger_mask(8, 8)
    inputs, targets = torch.zeros(2, 3, 1, 8, 8), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"badnets\.target"):
        BadNets(target=10).poison_samples(inputs, targets, 10, None, torch.Generator().manual_seed(0))


# -- the trigger -------------------------------------------------------------------------------
def test_stamp_is_exact_on_a_hand_made_image():
    """A 1x5x5 image with distinct pixels: the 2x2 trigger one pixel from the edges
    sets exactly rows 2-3, columns 2-3 to the normalised value, and stamping the
    normalised image equals normalising the stamped pixel image, bit for bit."""
    pixels = (torch.arange(25, dtype=torch.float32) / 25).reshape(1, 1, 5, 5)
    mean, std = torch.tensor([0.3]).view(1, 1, 1), torch.tensor([0.7]).view(1, 1, 1)
    attack = BadNets(size=2, margin=1, value=0.9)
    stamped = attack.stamp_trigger((pixels - mean) / std, (mean, std))
    by_hand = pixels.clone()
    by_hand[..., 2:4, 2:4] = 0.9
    assert torch.equal(stamped, (by_hand - mean) / std)
    changed = (stamped != (pixels - mean) / std)[0, 0]
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[2:4, 2:4] = True
    assert torch.equal(changed, expected)
    assert torch.equal(attack.stamp_trigger(pixels), by_hand)  # no stats: inputs are pixels


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_trigger_is_the_bottom_right_square_on_every_channel(shape):
    images = torch.rand(4, *shape, generator=torch.Generator().manual_seed(1))
    mean, std = normalization_stats("per_channel", images)
    stamped = BadNets(size=3).stamp_trigger((images - mean) / std, (mean, std))
    by_hand = images.clone()
    by_hand[..., -3:, -3:] = 1.0
    assert torch.equal(stamped, (by_hand - mean) / std)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 6), data=st.data())
def test_dba_parts_are_disjoint_and_their_union_is_the_full_trigger(size, data):
    parts = data.draw(st.integers(1, size))
    margin = data.draw(st.integers(0, 3))
    height, width = data.draw(st.integers(size + margin, 12)), data.draw(st.integers(size + margin, 12))
    attack = DBA(size=size, parts=parts, margin=margin)
    masks = attack.part_masks(height, width)
    assert masks.shape == (parts, height, width)
    assert torch.equal(masks.any(0), attack.trigger_mask(height, width))
    assert int(masks.sum()) == size * size  # disjoint
    assert bool(masks.flatten(1).any(1).all())  # no empty part


def test_poisoning_stamps_and_relabels_the_chosen_share_of_each_byzantine_client():
    """DBA with 2 parts on 3 Byzantine clients: each has round(0.5 * n) images with its
    own bar and label target, the rest untouched; client i carries part i mod 2."""
    images = torch.rand(3, 10, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(1, 10, (3, 10), generator=torch.Generator().manual_seed(3))
    attack = DBA(size=4, parts=2, target=0, value=1.0)
    stamped, relabelled = attack.poison_samples(images, labels, 10, None, torch.Generator().manual_seed(4))
    poisoned = relabelled == 0
    assert poisoned.sum(1).tolist() == [5, 5, 5]
    assert torch.equal(relabelled[~poisoned], labels[~poisoned])
    assert torch.equal(stamped[~poisoned], images[~poisoned])
    parts = attack.part_masks(8, 8)
    for client in range(3):
        expected = torch.where(parts[client % 2], torch.tensor(1.0), images[client, poisoned[client]])
        assert torch.equal(stamped[client, poisoned[client]], expected)


def test_attack_success_rate_counts_non_target_samples_only():
    # client 0: labels 0 (excluded), 1, 2 predicted 0, 0, 1 -> 1 of 2; client 1: only target -> NaN
    log_probs = torch.log(torch.tensor([
        [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]],
        [[0.9, 0.1], [0.9, 0.1], [0.9, 0.1]],
    ]))
    rates = attack_success_rate(log_probs, torch.tensor([[0, 1, 2], [0, 0, 0]]), target=0)
    assert rates[0] == 0.5 and math.isnan(rates[1])


# -- model replacement -------------------------------------------------------------------------
@pytest.mark.parametrize("boost", [None, 3.0])
def test_model_replacement_sends_boost_times_the_poisoned_update(boost):
    """The honest gradients of the model-replacement run's Byzantine clients are those
    of BadNets-poisoned data (same data as a BadNets run), and they send ``boost``
    times them (default N / B)."""
    options = {} if boost is None else {"boost": boost}
    replaced = RunParts.build(config({"name": "model_replacement", **options}), 0).federation
    badnets = RunParts.build(config({"name": "badnets"}), 0).federation
    clean = RunParts.build(config({"name": "none"}), 0).federation
    byzantine = replaced.byzantine
    assert torch.equal(replaced.train.inputs, badnets.train.inputs)
    assert torch.equal(replaced.train.targets, badnets.train.targets)
    assert not torch.equal(replaced.train.inputs[byzantine], clean.train.inputs[byzantine])
    assert torch.equal(replaced.train.inputs[~byzantine], clean.train.inputs[~byzantine])
    params = replaced.init_params(replaced.clients)
    gradients = replaced.gradients(params, replaced.train)
    assert torch.equal(gradients, badnets.gradients(params, badnets.train))
    delivered = replaced.deliver(gradients, 0, "gradient")
    gamma = boost if boost is not None else replaced.clients / int(byzantine.sum())
    assert gamma == (3.0 if boost else 44 / 4)
    assert torch.equal(delivered[byzantine], gradients[byzantine] * gamma)
    assert torch.equal(delivered[~byzantine], gradients[~byzantine])


def test_model_replacement_scales_models_about_the_honest_mean():
    messages = torch.tensor([[1.0, 1.0], [3.0, 3.0], [2.0, 0.0]])
    byzantine = torch.tensor([False, False, True])
    context = attacks.conformance.context(byzantine)
    context = type(context)(**{**context.__dict__, "kind": "model"})
    sent = ModelReplacement(boost=4.0)(messages, context)
    assert torch.equal(sent, torch.tensor([[2.0 + 4.0 * 0.0, 2.0 + 4.0 * -2.0]]))


# -- end to end ----------------------------------------------------------------------------------
def test_badnets_plants_a_backdoor_in_undefended_global_and_keeps_clean_accuracy():
    """Measured (seed 0): ASR 0.95 with accuracy 0.894 against 0.897 without attack.
    Thresholds: ASR above 90 %, accuracy within 5 points."""
    clean = final({"name": "none"})
    attacked = final({"name": "badnets"})
    assert "attack_success_rate" not in clean
    assert attacked["attack_success_rate"] > 0.9
    assert abs(attacked["test_accuracy"] - clean["test_accuracy"]) <= 0.05


@pytest.mark.slow  # two runs of 15 s; BadNets plants its backdoor in the default run
@pytest.mark.parametrize("attack", [{"name": "dba"}, {"name": "model_replacement"}])
def test_dba_and_model_replacement_plant_the_backdoor(attack):
    """Measured (seed 0): DBA (4 bars of a 4x4 square) ASR 1.0, model replacement
    0.99; accuracy 0.881 and 0.897 against 0.897 clean."""
    clean = final({"name": "none"})
    attacked = final(attack)
    assert attacked["attack_success_rate"] > 0.9
    assert abs(attacked["test_accuracy"] - clean["test_accuracy"]) <= 0.05


def test_attack_success_rate_is_low_without_poisoning():
    """A BadNets run without Byzantine clients: no image is poisoned, so the ASR is the
    clean model's rate of predicting ``target`` on triggered images (measured: about
    1 %).  The bound is chance level, 1 / C = 10 %: a clean model should not favour
    the target class more than a uniform guess would."""
    assert final({"name": "badnets"}, byzantine=0)["attack_success_rate"] < 0.1


def test_asr_is_written_to_history_and_summary_and_shown_by_results(tmp_path, capsys):
    out = tmp_path / "out"
    run_experiment(config({"name": "badnets"}, rounds=20, seeds=(0, 1)), out, progress=False)
    history = pd.read_csv(out / "history.csv")
    asr = history[history["metric"] == "attack_success_rate"]
    assert set(asr["round"]) == {0, 20} and set(asr["seed"]) == {0, 1}
    assert asr["value"].between(0, 1).all()
    summary = json.loads((out / "summary.json").read_text())
    assert "attack_success_rate" in summary["final"]["global"]
    table = summary_table(out)
    assert table.attrs["metrics"] == ["test_accuracy", "attack_success_rate"]
    assert table.attrs["percent"] == ["test_accuracy", "attack_success_rate"]
    assert main(["results", str(out)]) == 0
    assert "attack_success_rate" in capsys.readouterr().out


def test_same_config_and_seed_give_identical_rows(tmp_path):
    runs = [run_experiment(config({"name": "dba", "size": 4, "parts": 2}, rounds=10), tmp_path / name,
                           progress=False)
            for name in ("a", "b")]
    assert (tmp_path / "a" / "history.csv").read_bytes() == (tmp_path / "b" / "history.csv").read_bytes()
    assert runs[0]["final"] == runs[1]["final"]


# -- checkpoints -----------------------------------------------------------------------------
class Stop(Exception):
    """Raised from ``on_round``: the run dies after that round, before its checkpoint."""


def stop_after(rounds: int):
    count = [0]

    def on_round() -> None:
        count[0] += 1
        if count[0] == rounds:
            raise Stop

    return on_round


@pytest.mark.parametrize("method, attack, reshuffle", [
    ({"name": "global", "lr": 0.1, "heavy_ball": 0.9}, {"name": "model_replacement"}, True),
    ({"name": "knn_per", "lr": 0.1, "heavy_ball": 0.5}, {"name": "dba", "size": 2, "parts": 2}, False),
])
def test_backdoor_runs_resume_bit_identically(method, attack, reshuffle, tmp_path):
    """Digits with batches of 32 (an epoch is 6 rounds): stopped after 7 rounds, then 3
    more, and resumed, the rows (ASR included; KNN-Per's through its own predictor)
    equal an uninterrupted run's; with ``reshuffle_every_epoch`` every re-deal is
    poisoned again."""
    from robust_pfl.experiments import run_method, validate

    config = validate(parse_config({
        "seeds": [3], "rounds": 14, "eval_every": 2, "checkpoint_every": 2, "batch_size": 32,
        "byzantine": {"total": 2}, "attack": attack, "methods": [method],
        "task": {"name": "image", "dataset": "digits", "kind": "private_label", "clusters": 2,
                 "clients_per_cluster": 3, "model": {"name": "mlp", "hidden": [8]},
                 "reshuffle_every_epoch": reshuffle},
    }))
    method_config, seed = config.methods[0], config.seeds[0]
    rows = run_method(method_config, config, seed).rows
    assert any(row["metric"] == "attack_success_rate" for row in rows)
    path = tmp_path / "run.pt"
    for rounds in (7, 3):
        with pytest.raises(Stop):
            run_method(method_config, config, seed, on_round=stop_after(rounds), checkpoint=path)
    again = run_method(method_config, config, seed, checkpoint=path).rows

    def exact(table):
        return [(r["round"], r["metric"], float(r["value"]).hex()) for r in table]

    assert exact(again) == exact(rows)


@pytest.mark.parametrize("attack, field", [
    ({"name": "badnets", "target": 10}, "badnets.target"),
    ({"name": "dba", "size": 9, "parts": 2}, "dba.size"),
])
def test_target_and_trigger_size_are_checked_against_the_data_at_load(attack, field):
    from robust_pfl.config import ConfigError
    from robust_pfl.experiments import validate

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(config(attack))
