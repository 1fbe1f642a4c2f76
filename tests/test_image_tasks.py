"""Clustered image tasks (:mod:`robust_pfl.engine.tasks.images`): cluster transforms, dealing,
sizes, determinism, validation and the per-epoch reshuffle.

Most tests use a tiny synthetic :class:`LabelledImages` of random images, so every
client sample can be traced back to its source image (and rotation) exactly.  One test
builds the default task on the bundled digits; the ``slow`` one deals real MNIST with
Table 1's 300 clients.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from torch import Tensor

from robust_pfl.engine.data import ClientData
from robust_pfl.engine.datasets import DATA_ENV_VAR, DatasetError, LabelledImages, load_mnist, resolve_data_dir
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.seeding import generator
from robust_pfl.engine.tasks.images import KINDS, ImageTask
from robust_pfl.engine.tasks.partition import deal, dirichlet_proportions, largest_remainder
from robust_pfl.engine.tasks.transforms import MNIST_MEAN, MNIST_STD

CLASSES = 8


def tiny(n_train: int = 480, n_test: int = 160, classes: int = CLASSES, seed: int = 0) -> LabelledImages:
    """Random (hence pairwise distinct, in every rotation) 1x4x4 images, balanced labels."""
    g = torch.Generator().manual_seed(seed)
    return LabelledImages(
        train_images=torch.rand(n_train, 1, 4, 4, generator=g),
        train_labels=torch.arange(n_train) % classes,
        test_images=torch.rand(n_test, 1, 4, 4, generator=g),
        test_labels=torch.arange(n_test) % classes,
        num_classes=classes,
        name="tiny",
    )


def recover(inputs: Tensor, source: Tensor) -> tuple[Tensor, Tensor]:
    """``(index, turns)`` of each image in ``inputs[..., C, H, W]``: the source image it
    is and the quarter turns that rotated it (exactly one match is asserted)."""
    lookup = {image.numpy().tobytes(): i for i, image in enumerate(source)}
    flat = inputs.reshape(-1, *inputs.shape[-3:])
    found: list[list[tuple[int, int]]] = [[] for _ in range(flat.shape[0])]
    for turns in range(4):
        for row, image in enumerate(torch.rot90(flat, -turns, dims=(-2, -1)).contiguous()):
            if (index := lookup.get(image.numpy().tobytes())) is not None:
                found[row].append((index, turns))
    assert all(len(matches) == 1 for matches in found), "each image is exactly one rotated source image"
    index, turns = torch.tensor([matches[0] for matches in found]).reshape(*inputs.shape[:-3], 2).unbind(-1)
    return index, turns


def splits(task, data: LabelledImages) -> list[tuple[str, ClientData, Tensor, Tensor]]:
    """``(name, split, source images, source labels)`` of train, validation and test."""
    return [
        ("train", task.train, data.train_images, data.train_labels),
        ("validation", task.validation, data.train_images, data.train_labels),
        ("test", task.test, data.test_images, data.test_labels),
    ]


def build(data: LabelledImages | None = None, seed: int = 0, placement=None, **fields):
    fields = {"clusters": 4, "clients_per_cluster": 3, "normalize": "none", **fields}
    return ImageTask(**fields).build(seed, placement=placement, data=data or tiny())


# -- cluster transforms ---------------------------------------------------------------------------
def test_rotation_rotates_each_cluster_by_k_quarter_turns():
    data = tiny()
    task = build(data, kind="rotation", placement=ByzantinePlacement(total=2))
    ids = task.cluster_ids
    assert task.byzantine.sum() == 2 and ids[task.byzantine].tolist() == [0, 1]
    for name, split, images, labels in splits(task, data):
        index, turns = recover(split.inputs, images)
        assert torch.equal(turns, ids.view(-1, 1).expand_as(turns)), name  # Byzantine clients too
        assert torch.equal(split.targets, labels[index]), name
        unrotated = split.inputs[ids == 0]
        assert torch.equal(unrotated, images[index[ids == 0]]), name  # cluster 0: the source images
        first = (ids == 1).nonzero()[0, 0]
        assert torch.equal(split.inputs[first], torch.rot90(images[index[first]], 1, dims=(-2, -1)))


def test_rotation_step_two_gives_half_turns():
    data = tiny()
    task = build(data, kind="rotation", clusters=2, rotation_step=2)
    _, turns = recover(task.train.inputs, data.train_images)
    assert torch.equal(turns, (2 * task.cluster_ids).view(-1, 1).expand_as(turns))


def test_private_label_shifts_labels_of_cluster_k_by_k():
    data = tiny()
    task = build(data, kind="private_label", placement=ByzantinePlacement(per_cluster=1))
    for name, split, images, labels in splits(task, data):
        index, turns = recover(split.inputs, images)
        assert (turns == 0).all(), name
        expected = (labels[index] + task.cluster_ids.view(-1, 1)) % CLASSES
        assert torch.equal(split.targets, expected), name
    assert task.num_classes == CLASSES


def test_label_skew_clients_hold_only_their_clusters_labels():
    data = tiny()
    task = build(data, kind="label_skew")  # L = 8 // 4 = 2: cluster k holds {2k, 2k + 1}
    for name, split, images, labels in splits(task, data):
        index, _ = recover(split.inputs, images)
        assert torch.equal(split.targets, labels[index]), name
        assert torch.equal(split.targets.div(2, rounding_mode="floor"), task.cluster_ids.view(-1, 1).expand_as(index))


def test_label_skew_overlapping_sets_wrap_around_and_stay_disjoint():
    data = tiny()
    task = build(data, kind="label_skew", clusters=3, labels_per_cluster=3)  # {0,1,2} {3,4,5} {6,7,0}
    held = {0: {0, 1, 2}, 1: {3, 4, 5}, 2: {6, 7, 0}}
    for name, split, images, _ in splits(task, data):
        for client, cluster in enumerate(task.cluster_ids.tolist()):
            assert set(split.targets[client].tolist()) <= held[cluster], name
    train, _ = recover(torch.cat([task.train.inputs, task.validation.inputs], 1), data.train_images)
    assert train.unique().numel() == train.numel()
    holds_zero = (task.train.targets == 0).any(1)
    assert holds_zero[task.cluster_ids == 0].any() and holds_zero[task.cluster_ids == 2].any()  # label 0 is shared


def test_mixture_draws_the_given_fraction_from_each_of_two_rotations():
    data = tiny()
    task = build(
        data, kind="mixture", mixture_weight=0.75, train_per_client=8, validation_per_client=4, test_per_client=4
    )
    ids = task.cluster_ids.view(-1, 1)
    for name, split, images, labels in splits(task, data):
        index, turns = recover(split.inputs, images)
        assert torch.equal(split.targets, labels[index]), name
        own = turns == ids
        assert ((turns == ids) | (turns == (ids + 1) % 4)).all(), name
        assert (own.sum(1) == round(0.75 * split.samples_per_client)).all(), name


def test_dirichlet_clusters_share_one_label_histogram():
    data = tiny(n_train=4000, n_test=2000)
    seed = 3
    task = build(data, seed=seed, kind="dirichlet", clusters=3, clients_per_cluster=4, dirichlet_alpha=0.5)
    q = dirichlet_proportions(3, CLASSES, 0.5, seed)
    ids = task.cluster_ids
    histograms = {}
    for name, split, images, labels in splits(task, data):
        index, turns = recover(split.inputs, images)
        assert torch.equal(split.targets, labels[index]) and (turns == 0).all(), name
        counts = torch.nn.functional.one_hot(split.targets, CLASSES).sum(1)  # [N, C]
        n = split.samples_per_client
        for k in range(3):
            rows = counts[ids == k]
            assert (rows == rows[0]).all(), name  # one histogram per cluster
            assert ((rows[0] - n * q[k]).abs() < 1).all(), name  # the cluster's proportions, rounded
        histograms[name] = counts.double() / n
    assert not torch.equal(histograms["train"][0], histograms["train"][-1])  # clusters differ
    assert (histograms["train"] - histograms["test"]).abs().max() < 0.1  # same distribution (loosely)


# -- shapes, sizes, disjointness -------------------------------------------------------------------
def test_default_task_on_digits_shapes_and_objective():
    builder = ImageTask()
    task = builder.build(0, placement=ByzantinePlacement(total=3, per_cluster=1))
    n_clients = 4 * 10 + 4 + 3
    assert task.cluster_ids.shape == task.byzantine.shape == (n_clients,)
    assert task.byzantine.tolist() == [False] * 40 + [True] * 7
    assert task.train.inputs.shape[0] == n_clients and task.train.inputs.shape[2:] == (1, 8, 8)
    # 1437 digits train images over 47 clients: 30 each, 3 of them for validation
    assert task.train.inputs.shape[1] == 27 and task.validation.inputs.shape[1] == 3
    assert task.test.inputs.shape[:2] == (n_clients, 360 // n_clients)
    assert task.train.targets.shape == task.train.inputs.shape[:2] and task.train.targets.dtype == torch.int64
    assert task.objective.dim == 64 * 200 + 200 + 200 * 10 + 10 and task.num_classes == 10
    assert builder.normalization == "per_channel"
    models = task.objective.init(n_clients, generator(0, "init"), torch.float32)
    metrics = task.evaluate(models)
    assert metrics["test_accuracy"].shape == (n_clients,) and torch.isfinite(metrics["test_loss"]).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("partition", ["fixed", "official"])
def test_shards_are_disjoint_and_equal_sized(kind, partition):
    data = tiny(n_train=960, n_test=320)
    fields = {"clusters": 2, "labels_per_cluster": 3} if kind != "private_label" else {}
    task = build(data, kind=kind, partition=partition, placement=ByzantinePlacement(total=1), **fields)
    train, _ = recover(torch.cat([task.train.inputs, task.validation.inputs], 1), data.train_images)
    test, _ = recover(task.test.inputs, data.test_images)
    assert train.shape[0] == test.shape[0] == task.cluster_ids.numel()
    assert train.unique().numel() == train.numel()  # no sample in two clients, nor in train and validation
    assert test.unique().numel() == test.numel()  # test images come from the test split only


def test_default_sizes_deal_the_whole_train_set_over_all_clients():
    data = tiny(n_train=480, n_test=160)
    task = build(data, kind="rotation", placement=ByzantinePlacement(total=4), validation_fraction=0.25)
    # 480 / 16 clients = 30 each, 25 % of it validation; 160 / 16 = 10 test
    assert (task.train.samples_per_client, task.validation.samples_per_client) == (22, 8)
    assert task.test.samples_per_client == 10


def test_explicit_sizes():
    task = build(tiny(), train_per_client=9, test_per_client=5, validation_fraction=0.25)
    assert task.train.samples_per_client == 9 and task.validation.samples_per_client == 3
    assert task.test.samples_per_client == 5


def test_official_and_fixed_dealing_rules():
    samples, clients, per_client = 50, 7, 6
    groups = torch.zeros(samples, dtype=torch.long)
    quotas = [torch.full((clients, 1), per_client)]
    perm = torch.randperm(samples, generator=generator(5, "deal"))
    (official,) = deal(groups, quotas, generator(5, "deal"), "official")
    (fixed,) = deal(groups, quotas, generator(5, "deal"), "fixed")
    for r in range(clients):  # client r takes every N-th index from position r
        assert official[r].tolist() == perm[r::clients][:per_client].tolist()
    assert torch.equal(fixed, perm[: clients * per_client].view(clients, per_client))


def test_deal_honours_unequal_quotas_and_carves_parts():
    labels = torch.arange(60) % 3
    quotas = [torch.tensor([[2, 1, 0], [0, 1, 2]]), torch.tensor([[1, 0, 0], [0, 0, 1]])]
    for rule in ("fixed", "official"):
        first, second = deal(labels, quotas, generator(0, "deal"), rule)
        for part, got in zip(quotas, (first, second)):
            assert torch.equal(torch.nn.functional.one_hot(labels[got], 3).sum(1), part)
        both = torch.cat([first, second], 1)
        assert both.unique().numel() == both.numel()
    weights = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    assert torch.equal(largest_remainder(7, weights), torch.tensor([[4, 2, 1]]))  # 3.5, 2.1, 1.4


# -- determinism --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_task_other_seed_other_shards(kind):
    data = tiny()
    fields = {"kind": kind, "clusters": 2}
    first, again, other = (build(data, seed=s, **fields) for s in (4, 4, 5))
    for name in ("train", "validation", "test"):
        a, b = getattr(first, name), getattr(again, name)
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(first.train.inputs, other.train.inputs)


# -- validation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, field",
    [
        ({"dataset": "svhn"}, "dataset"),
        ({"kind": "spin"}, "kind"),
        ({"partition": "random"}, "partition"),
        ({"normalize": "zscore"}, "normalize"),
        ({"clusters": 0}, "clusters"),
        ({"clusters": 5}, "clusters"),  # five distinct rotations by multiples of 90 degrees
        ({"kind": "mixture", "rotation_step": 2, "clusters": 3}, "clusters"),
        ({"clients_per_cluster": True}, "clients_per_cluster"),
        ({"train_per_client": 0}, "train_per_client"),
        ({"validation_per_client": 0}, "validation_per_client"),
        ({"test_per_client": -1}, "test_per_client"),
        ({"labels_per_cluster": 0}, "labels_per_cluster"),
        ({"rotation_step": 4}, "rotation_step"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"mixture_weight": 1.5}, "mixture_weight"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
        ({"model": {"name": "resnet"}}, "model.name"),
        ({"model": {"name": "mlp", "depth": 3}}, "model.depth"),
        ({"model": "mlp"}, "model"),
    ],
)
def test_invalid_fields_are_named(fields, field):
    with pytest.raises(ValueError, match=f"^{re.escape(field)}\\b"):
        ImageTask(**fields)


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"kind": "private_label", "clusters": 4}, "clusters"),  # 4 > 3 classes
        ({"kind": "label_skew", "clusters": 4}, "clusters"),  # 3 // 4 = 0 labels each
        ({"kind": "label_skew", "clusters": 3, "labels_per_cluster": 4}, "labels_per_cluster"),
        ({"kind": "label_skew", "clusters": 2, "labels_per_cluster": 3}, "labels_per_cluster"),  # identical
        ({"train_per_client": 40}, "train_per_client"),
        ({"test_per_client": 20}, "test_per_client"),
        ({"train_per_client": 2**64}, "train_per_client"),  # past int64: refused, not an OverflowError
        ({"test_per_client": 2**64}, "test_per_client"),
        ({"clients_per_cluster": 100}, "clients_per_cluster"),
    ],
)
def test_settings_the_data_cannot_satisfy_are_named(fields, field):
    data = tiny(n_train=240, n_test=80, classes=3)
    with pytest.raises(ValueError, match=f"^{re.escape(field)}\\b"):
        build(data, **{"clusters": 2, **fields})


# -- normalisation ----------------------------------------------------------------------------------------
def test_normalisations():
    data = tiny()
    plain = build(data, kind="rotation")
    mnist = build(data, kind="rotation", normalize="mnist")
    per_channel = build(data, kind="rotation", normalize="per_channel")
    assert torch.allclose(mnist.train.inputs, (plain.train.inputs - MNIST_MEAN) / MNIST_STD)
    mean, std = data.train_images.mean(), data.train_images.std(correction=0)
    assert torch.allclose(per_channel.test.inputs, (plain.test.inputs - mean) / std, atol=1e-5)
    assert ImageTask(dataset="mnist").normalization == "mnist"
    assert ImageTask(dataset="cifar10").normalization == "per_channel"


def test_dtype_is_applied():
    task = ImageTask(clusters=2, clients_per_cluster=2).build(0, dtype=torch.float64, data=tiny())
    assert task.train.inputs.dtype == task.test.inputs.dtype == torch.float64


# -- reshuffle ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["rotation", "label_skew", "dirichlet"])
def test_reshuffle_redeals_train_with_the_same_shapes_and_transforms(kind):
    data = tiny(n_train=960)
    builder = ImageTask(kind=kind, clusters=2, clients_per_cluster=3, normalize="none", partition="official")
    task = builder.build(1, data=data)
    epoch1 = builder.reshuffle(task, 1, 1, data=data)
    assert epoch1.inputs.shape == task.train.inputs.shape and epoch1.targets.shape == task.train.targets.shape
    before, _ = recover(task.train.inputs, data.train_images)
    after, turns = recover(epoch1.inputs, data.train_images)
    validation, _ = recover(task.validation.inputs, data.train_images)
    assert not torch.equal(before, after)
    assert after.unique().numel() == after.numel()
    assert not set(after.flatten().tolist()) & set(validation.flatten().tolist())
    assert torch.equal(epoch1.targets, data.train_labels[after])
    ids = task.cluster_ids.view(-1, 1)
    assert torch.equal(turns, (ids if kind == "rotation" else 0 * ids).expand_as(turns))
    histogram = torch.nn.functional.one_hot(epoch1.targets, CLASSES).sum(1)
    if kind == "dirichlet":  # same label quotas as the built split
        assert torch.equal(histogram, torch.nn.functional.one_hot(task.train.targets, CLASSES).sum(1))
    if kind == "label_skew":
        assert torch.equal(epoch1.targets.div(4, rounding_mode="floor"), ids.expand_as(after))
    again, epoch2 = builder.reshuffle(task, 1, 1, data=data), builder.reshuffle(task, 2, 1, data=data)
    assert torch.equal(again.inputs, epoch1.inputs) and not torch.equal(epoch2.inputs, epoch1.inputs)


def test_reshuffle_refuses_a_task_of_another_builder():
    data = tiny()
    task = build(data, kind="rotation", train_per_client=5)
    with pytest.raises(ValueError, match="^task"):
        ImageTask(clusters=4, clients_per_cluster=3).reshuffle(task, 1, 0, data=data)
    with pytest.raises(ValueError, match="^epoch"):
        ImageTask(clusters=4, clients_per_cluster=3).reshuffle(task, -1, 0, data=data)


# -- real MNIST (Table 1) -----------------------------------------------------------------------------------
DEFAULT_REAL_MNIST = Path("/work/shared/data/mnist")


@pytest.mark.slow
def test_table1_mnist_rotation_and_private_label():
    if os.environ.get(DATA_ENV_VAR):
        try:
            markers = ["train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"]
            data = load_mnist(resolve_data_dir(None, "mnist", markers=markers))
        except DatasetError as error:
            pytest.skip(f"real MNIST not found: {error}")
    elif DEFAULT_REAL_MNIST.is_dir():
        data = load_mnist(DEFAULT_REAL_MNIST)
    else:
        pytest.skip(f"real MNIST not available: set {DATA_ENV_VAR}")
    for kind in ("rotation", "private_label"):
        builder = ImageTask(
            dataset="mnist",
            kind=kind,
            clusters=4,
            clients_per_cluster=75,
            partition="official",
            model={"name": "mlp", "hidden": [200], "loss": "softmax_nll"},
        )
        task = builder.build(0, data=data)
        # 60000 / 300 = 200 train images per client (20 validation), 10000 / 300 = 33 test
        assert task.train.inputs.shape == (300, 180, 1, 28, 28)
        assert task.validation.inputs.shape == (300, 20, 1, 28, 28)
        assert task.test.inputs.shape == (300, 33, 1, 28, 28)
        assert task.objective.dim == 784 * 200 + 200 + 200 * 10 + 10
        assert abs(float(task.train.inputs.mean())) < 0.05  # the official normalisation centres MNIST
