"""The per-epoch re-deal without a spike (issue 45): the layout and the normalised,
turned images computed once (``ImageTask.prepared_redeal``), the next epoch gathered
a share per round (``EpochRedealer``).  Every path must give the re-deal the plain
``ImageTask.reshuffle`` gives, element for element."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from robust_pfl.engine.federation import Federation
from robust_pfl.engine.tasks.images import ImageTask
from robust_pfl.engine.tasks.transforms import PreparedImages, materialise, normalization_stats
from robust_pfl.experiments import EpochRedealer
from test_image_tasks import tiny

KINDS = ["rotation", "mixture", "private_label"]


def builder_of(kind: str, normalize: str = "per_channel") -> ImageTask:
    return ImageTask(kind=kind, clusters=4, clients_per_cluster=3, normalize=normalize, partition="official")


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["none", "mnist", "per_channel"]))
def test_prepared_images_gather_what_materialise_computes(seed, normalize):
    data = tiny(n_train=200, seed=seed % 1000)
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, 200, (5, 7), generator=generator)
    turns = torch.randint(0, 4, (5, 7), generator=generator)
    shift = torch.randint(0, 3, (5,), generator=generator)
    stats = normalization_stats(normalize, data.train_images)
    prepared = PreparedImages(data.train_images, stats, turns.unique().tolist())
    plain = materialise(data.train_images, data.train_labels, index, turns, shift, 8, stats, torch.float32)
    fast = materialise(data.train_images, data.train_labels, index, turns, shift, 8, stats, torch.float32, prepared,
                       out=torch.empty_like(plain.inputs))
    assert torch.equal(fast.inputs, plain.inputs) and torch.equal(fast.targets, plain.targets)


def test_prepared_images_serve_only_their_images_statistics_and_turns():
    data = tiny()
    stats = normalization_stats("per_channel", data.train_images)
    prepared = PreparedImages(data.train_images, stats, [0, 2])
    turns = torch.tensor([[0, 2]])
    assert prepared.serves(data.train_images, stats, turns)
    assert not prepared.serves(data.train_images, stats, torch.tensor([[1]]))  # a turn it lacks
    assert not prepared.serves(data.train_images.clone(), stats, turns)
    assert not prepared.serves(data.train_images, normalization_stats("mnist", data.train_images), turns)


@pytest.mark.parametrize("kind", KINDS)
def test_reshuffle_with_the_cache_equals_reshuffle_without(kind):
    data = tiny(n_train=960)
    builder = builder_of(kind)
    task = builder.build(3, data=data)
    cache = builder.prepared_redeal(task, 3, data)
    assert cache.images is not None
    for epoch in (1, 2, 5):
        plain = builder.reshuffle(task, epoch, 3, data=data)
        fast = builder.reshuffle(task, epoch, 3, data=data, prepared=cache, out=torch.empty_like(task.train.inputs))
        assert torch.equal(fast.inputs, plain.inputs) and torch.equal(fast.targets, plain.targets)
    # a cache made for another seed is not used: the re-deal is this seed's own
    other = builder.prepared_redeal(task, 4, data)
    again = builder.reshuffle(task, 2, 3, data=data, prepared=other)
    assert torch.equal(again.inputs, builder.reshuffle(task, 2, 3, data=data).inputs)
    assert not torch.equal(builder.reshuffle(task, 2, 4, data=data).inputs, again.inputs)


def redealer(kind: str, per_epoch: int, data, seed: int = 3) -> tuple[EpochRedealer, Federation]:
    builder = builder_of(kind)
    task = builder.build(seed, data=data)
    cache = builder.prepared_redeal(task, seed, data)
    spares = [torch.zeros_like(task.train.inputs) for _ in range(2)]
    federation = Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, 8)
    return EpochRedealer(builder, task, seed, data, per_epoch, cache, spares), federation


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_epoch", [1, 3, 5])
@pytest.mark.parametrize("start", [0, 4])
def test_gathering_ahead_gives_each_epoch_the_plain_re_deal(kind, per_epoch, start, monkeypatch):
    """Round by round from ``start`` (4: a run resumed mid-epoch, whose gathering
    starts where it stands): after every epoch's first round the federation holds
    exactly ``reshuffle``'s deal of that epoch, gathered ahead (no re-deal at once
    after the first round), and the spare being gathered into is never the data the
    federation trains on."""
    data = tiny(n_train=960)
    redeal, federation = redealer(kind, per_epoch, data)
    if start:
        redeal.catch_up(federation, start)
    at_once = []
    plain_reshuffle = ImageTask.reshuffle
    monkeypatch.setattr(ImageTask, "reshuffle", lambda *args, **kwargs: at_once.append(1) or plain_reshuffle(*args, **kwargs))
    for round_index in range(start, start + 4 * per_epoch + 1):
        calls = len(at_once)
        redeal.before_round(federation, round_index)
        if round_index > start:  # a resumed run's first round has nothing gathered yet
            assert len(at_once) == calls, f"round {round_index} re-dealt at once"
        if redeal.ahead:
            assert redeal.ahead["inputs"].data_ptr() != federation.train.inputs.data_ptr()
        if round_index % per_epoch == 0 and round_index:
            plain = redeal.builder.reshuffle(redeal.task, round_index // per_epoch, redeal.seed, data=data)
            assert torch.equal(federation.train.inputs, plain.inputs)
            assert torch.equal(federation.train.targets, plain.targets)


def test_the_first_deal_is_never_overwritten():
    """The task's own train split (epoch 0) stays as built: no spare is ever it."""
    data = tiny(n_train=960)
    redeal, federation = redealer("rotation", 2, data)
    first = redeal.task.train.inputs.clone()
    for round_index in range(9):
        redeal.before_round(federation, round_index)
    assert torch.equal(redeal.task.train.inputs, first)
