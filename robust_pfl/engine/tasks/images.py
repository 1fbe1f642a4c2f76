"""Clustered image classification (Werner et al. Sec. 4.2 and Table 1).

:class:`ImageTask` deals a :class:`~robust_pfl.engine.datasets.LabelledImages` data set to
``K * clients_per_cluster`` honest clients plus the Byzantine ones of a
:class:`~robust_pfl.engine.placement.ByzantinePlacement` (a Byzantine client holds data of the
cluster it is placed in, exactly like an honest one) and makes the clusters differ:

* ``"rotation"`` (Table 1): cluster ``k`` rotates its images by ``k * 90`` degrees
  (``torch.rot90`` on H, W, counter-clockwise).  ``rotation_step`` (1, 2 or 3 quarter
  turns) changes the angle to ``k * rotation_step * 90``; angles stay multiples of 90
  so that no interpolation is needed, hence at most ``4 / gcd(rotation_step, 4)``
  clusters (4 with the default) have distinct rotations.
* ``"private_label"`` (Table 1, Fig. 6, Fig. 4): labels ``y -> (y + k) mod C``.
* ``"label_skew"`` (Sec. 4.2, CIFAR-100 with 10 labels per cluster): cluster ``k``
  holds only the labels ``[k * L, (k + 1) * L)`` with ``L = labels_per_cluster``
  (default ``C // K``).  If ``K * L > C`` the sets ``{(k * L + j) mod C}`` wrap around
  and overlap; a shared label's samples are split between its clusters (see
  :func:`~robust_pfl.engine.tasks.partition.label_skew_groups`).  Each client takes a uniform
  random share of its cluster's pool (so its label mix follows the pool's).
* ``"mixture"`` (after FedSPD, Sec. 6 and App. B: each client's data is a mixture of
  two distributions; there a 10-90 % random mix of rotated and unrotated MNIST per
  client): let ``D_j`` be the data set with every image rotated by
  ``j * rotation_step * 90`` degrees (labels unchanged).  A client of cluster ``k``
  holds ``round(mixture_weight * n)`` samples of ``D_k`` and the other samples of
  ``D_{(k + 1) mod K}``, in every split (train, validation and test separately).  The
  samples themselves are dealt uniformly at random, as for ``"rotation"``.
* ``"dirichlet"`` (Hsu et al., "Measuring the Effects of Non-Identical Data
  Distribution for Federated Visual Classification", 2019): cluster ``k`` draws label
  proportions ``q_k ~ Dirichlet(dirichlet_alpha * 1_C)`` once, and *every* client of
  the cluster holds ``round(n * q_k)`` samples of each label (largest-remainder
  rounding, so all its clients share one label histogram and the clusters exist).
  Hsu et al. draw one ``q`` per client; one per cluster is what makes it a clustered
  task.

Sizes.  Every client holds the same numbers of samples (data are stacked ``[N, n, ...]``).
By default (``train_per_client=None``) the source train split is dealt as evenly as
possible over *all* ``N`` clients (honest and Byzantine): each client gets the largest
share ``s`` that every cluster's pool can give all its clients (with skewed kinds: the
minimum over clusters and labels; leftovers are unused), and ``validation_per_client``
(default ``max(1, round(validation_fraction * s))``) of it is carved out as validation
(never from the test split); the rest is the train split.  The test split is dealt the
same way from the source test split.  Explicit sizes that do not fit raise a
``ValueError`` naming the field and the largest size that fits: samples are always drawn
without replacement, so no sample reaches two clients and no test image is in any train
or validation split.  Validation and test splits get the client's cluster transform and
(label skew, Dirichlet) the same label distribution as its train split.

Dealing (``partition``): ``"fixed"`` gives seeded fixed per-client shards; ``"official"``
deals a seeded permutation as the official code does (client ``r`` takes every
``N``-th index from position ``r``); see :mod:`robust_pfl.engine.tasks.partition`.  The
official code also re-deals MNIST's train split every epoch; fixed stacked data cannot
express that, so :meth:`ImageTask.reshuffle` returns the re-dealt train split of an
epoch.  The engine does not call it (yet): as built, every task uses fixed shards.

Normalisation (``normalize``): ``"none"``; ``"mnist"`` (mean 0.1307 / std 0.3081, the
official code's); ``"per_channel"`` (each channel's mean and std over the source train
split).  The default ``None`` means ``"mnist"`` for ``dataset="mnist"`` (to match the
official code) and ``"per_channel"`` for every other data set (MNIST's constants are
MNIST's own per-channel statistics; other data sets get theirs).

Every random choice comes from a named stream of the seed
(:func:`robust_pfl.engine.seeding.generator`): ``images/deal/train``, ``images/deal/test``,
``images/label-skew``, ``images/dirichlet`` and ``images/deal/train/epoch-<e>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Any, Literal, get_args

import torch
from pydantic import Field
from torch import Tensor

from robust_pfl.engine.data import ClientData
from robust_pfl.engine.datasets import DATASETS, LabelledImages, load_dataset
from robust_pfl.engine.networks import make_network
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.seeding import generator
from robust_pfl.engine.tasks.base import Task
from robust_pfl.engine.tasks.partition import (
    Rule,
    deal,
    dirichlet_proportions,
    fits,
    group_sizes,
    label_sets,
    label_skew_groups,
    largest_remainder,
    largest_share,
)
from robust_pfl.engine.tasks.transforms import Normalization, PreparedImages, materialise, normalization_stats, relabel
from robust_pfl.engine.validation import options

Kind = Literal["rotation", "private_label", "label_skew", "mixture", "dirichlet"]
KINDS: tuple[str, ...] = get_args(Kind)
ROTATION_KINDS: tuple[str, ...] = ("rotation", "mixture")


def _default_model() -> dict[str, Any]:
    return {"name": "mlp", "hidden": [200]}


class _TooManyClients(ValueError):
    """The default sizes leave a client without a train or test sample."""


class TooManyByzantine(ValueError):
    """The Byzantine clients alone leave a client without a train or test sample: no
    ``clients_per_cluster`` fits, and the config's ``byzantine`` table is to blame."""


@dataclass(frozen=True)
class _Layout:
    """Which source samples each client holds, and how train is dealt again.

    ``groups``/``quotas``: the train split's groups ``[M_train]`` and the train part's
    quotas ``[N, G]`` (what :meth:`ImageTask.reshuffle` re-deals).
    """

    train: Tensor
    validation: Tensor
    test: Tensor
    groups: Tensor
    quotas: Tensor


@dataclass(frozen=True)
class RedealCache:
    """What a task's per-epoch re-deal reuses (:meth:`ImageTask.prepared_redeal`): the
    task's seed and clusters, its layout (whose validation samples stay fixed and whose
    train quotas are dealt again), and its train images prepared by turn."""

    seed: int
    ids: Tensor
    layout: _Layout
    images: PreparedImages | None

    def serves(self, task: Task, seed: int) -> bool:
        """Whether this cache was made for ``task``'s clusters and ``seed``."""
        return self.seed == seed and torch.equal(self.ids, task.cluster_ids.cpu())


@options("task", where="")
class ImageTask:
    """Builder of a clustered image-classification task (module docstring).

    Attributes:
        dataset: a key of :data:`robust_pfl.engine.datasets.DATASETS` (``"digits"`` needs no
            files).
        data_dir: its directory (``None``: ``$ROBUST_PFL_DATA``; ignored by digits).
        kind: ``"rotation"``, ``"private_label"``, ``"label_skew"``, ``"mixture"`` or
            ``"dirichlet"``.
        clusters: ``K``.
        clients_per_cluster: honest clients per cluster.
        train_per_client, validation_per_client, test_per_client: samples per client
            (``None``: deal the source splits evenly, see the module docstring).
        validation_fraction: share of a client's train share carved out as validation
            when ``validation_per_client`` is ``None`` (with an explicit
            ``train_per_client = t``: ``max(1, round(t * f / (1 - f)))`` validation
            samples, so that they are the fraction ``f`` of the share).
        partition: ``"fixed"`` or ``"official"`` dealing.
        model: ``make_network`` spec, e.g. ``{"name": "mlp", "hidden": [200]}`` (the
            default: 64-200-10 on digits, Werner et al.'s 784-200-10 on MNIST; add
            ``"loss": "softmax_nll"`` for the official code's loss).
        normalize: ``"none"``, ``"mnist"``, ``"per_channel"`` or ``None`` (automatic).
        rotation_step: quarter turns between consecutive clusters' rotations
            (``"rotation"``, ``"mixture"``).
        mixture_weight: share of a ``"mixture"`` client's samples from its own
            cluster's distribution, in ``[0, 1]``.
        labels_per_cluster: ``L`` of ``"label_skew"`` (``None``: ``C // K``).
        dirichlet_alpha: concentration of ``"dirichlet"`` (smaller: more skewed).
    """

    dataset: Annotated[str, Field(description="a data set of robust_pfl.engine.datasets.DATASETS")] = "digits"
    data_dir: Annotated[str | None, Field(description="directory of the data files (else $ROBUST_PFL_DATA)")] = None
    kind: Annotated[Kind, Field(description="how the clusters differ")] = "rotation"
    clusters: Annotated[int, Field(ge=1, description="K, the number of clusters")] = 4
    clients_per_cluster: Annotated[int, Field(ge=1, description="honest clients per cluster")] = 10
    train_per_client: Annotated[int | None, Field(ge=1, description="train samples per client (None: an even deal)")] = None
    validation_per_client: Annotated[int | None, Field(ge=1, description="validation samples per client")] = None
    test_per_client: Annotated[int | None, Field(ge=1, description="test samples per client")] = None
    validation_fraction: Annotated[float, Field(gt=0, lt=1, description="validation share of a client's train share")] = 0.1
    partition: Annotated[Rule, Field(description="the fixed or the official code's dealing")] = "fixed"
    model: Annotated[dict[str, Any], Field(description="make_network spec")] = dataclass_field(
        default_factory=_default_model, hash=False)
    normalize: Annotated[Normalization | None, Field(description="input normalisation (None: automatic)")] = None
    rotation_step: Annotated[int, Field(ge=1, le=3, description="quarter turns between clusters' rotations")] = 1
    mixture_weight: Annotated[float, Field(ge=0, le=1, description="a mixture client's share of its own cluster")] = 0.8
    labels_per_cluster: Annotated[int | None, Field(ge=1, description="L of label_skew (None: C // K)")] = None
    dirichlet_alpha: Annotated[float, Field(gt=0, description="concentration of dirichlet (smaller: more skewed)")] = 0.5

    def __post_init__(self) -> None:
        _choice("dataset", self.dataset, sorted(DATASETS))
        if self.kind in ROTATION_KINDS and self.clusters > self.distinct_rotations:
            raise ValueError(
                f"clusters must be <= {self.distinct_rotations} for kind={self.kind!r} with "
                f"rotation_step={self.rotation_step} (rotations by multiples of 90 degrees), "
                f"got {self.clusters}"
            )
        if "name" not in self.model:
            raise ValueError(f"model must be a mapping with a 'name' (see make_network), got {self.model!r}")
        make_network(self.model, (1, 8, 8), 10)  # names and options (raises "model.<field> ...")

    # -- derived settings ---------------------------------------------------------------
    @property
    def distinct_rotations(self) -> int:
        """How many clusters can have distinct rotations: ``4 / gcd(rotation_step, 4)``."""
        return 4 // math.gcd(self.rotation_step, 4)

    @property
    def normalization(self) -> Normalization:
        """``normalize``, with ``None`` resolved (``"mnist"`` for MNIST, else
        ``"per_channel"``)."""
        if self.normalize is not None:
            return self.normalize
        return "mnist" if self.dataset == "mnist" else "per_channel"

    # -- public API ---------------------------------------------------------------------
    def load(self, data: LabelledImages | None = None) -> LabelledImages:
        """``data``, or ``load_dataset(dataset, data_dir)`` when it is ``None``."""
        return load_dataset(self.dataset, self.data_dir) if data is None else data

    def build(
        self,
        seed: int,
        placement: ByzantinePlacement | None = None,
        dtype: torch.dtype = torch.float32,
        data: LabelledImages | None = None,
    ) -> Task:
        """The task for ``seed``: data dealt to honest then Byzantine clients (cluster
        order, :meth:`ByzantinePlacement.place`), objective from ``make_network``.

        Args:
            seed: decides the dealing (and the Dirichlet draws).
            placement: Byzantine clients (``None``: none).
            dtype: of the inputs (targets are int64 labels).
            data: the loaded data set (``None``: :meth:`load` it).

        Raises:
            ValueError: a setting the data set cannot satisfy (too many clusters for
                its classes, sizes that do not fit, ...), naming the field.
        """
        data = self.load(data)
        ids, byzantine = (placement or ByzantinePlacement()).place(self.clusters, self.clients_per_cluster)
        layout = self._layout(seed, ids, data)
        stats = normalization_stats(self.normalization, data.train_images)
        train_source = (data.train_images, data.train_labels)
        return Task(
            objective=make_network(self.model, data.image_shape, data.num_classes),
            train=self._materialise(train_source, layout.train, ids, data.num_classes, stats, dtype),
            validation=self._materialise(train_source, layout.validation, ids, data.num_classes, stats, dtype),
            test=self._materialise(
                (data.test_images, data.test_labels), layout.test, ids, data.num_classes, stats, dtype
            ),
            cluster_ids=ids,
            byzantine=byzantine,
            optima=None,
            num_classes=data.num_classes,
        )

    def check(
        self, seed: int, placement: ByzantinePlacement | None = None, data: LabelledImages | None = None
    ) -> None:
        """Raise the ``ValueError`` :meth:`build` would raise for ``data`` (classes,
        sizes) without dealing a sample.  When the default sizes leave a client without
        a train or test sample, the message also gives the largest
        ``clients_per_cluster`` that fits (with the same Byzantine placement)."""
        data = self.load(data)
        placement = placement or ByzantinePlacement()
        # More honest clients than train images leave one without a sample; said by
        # arithmetic, since dealing (and the search below) allocates one entry per client.
        most = data.num_train // self.clusters
        try:
            if self.clients_per_cluster > most:
                field = "clients_per_cluster" if most else "clusters"
                raise _TooManyClients(f"{field}: {self.clusters} x {self.clients_per_cluster} honest clients are "
                                      f"more than {data.name}'s {data.num_train} train images")
            self._fitted_sizes(seed, placement, data, self.clients_per_cluster)
        except _TooManyClients as error:
            fits, fails = 0, min(self.clients_per_cluster, most + 1)  # sizes shrink as clients grow
            while fails - fits > 1:
                middle = (fits + fails) // 2
                try:
                    self._fitted_sizes(seed, placement, data, middle)
                    fits = middle
                except ValueError:
                    fails = middle
            held = f"{data.num_train} train and {data.num_test} test images"
            byzantine = placement.total_count(self.clusters, 1)
            if not fits and byzantine and most:  # else the clusters alone outnumber the images
                raise TooManyByzantine(
                    f"{byzantine} Byzantine clients leave no room: with them {data.name} ({held}) fits no "
                    f"clients_per_cluster at all ({error}); lower byzantine.total / byzantine.per_cluster"
                ) from None
            limit = f"at most clients_per_cluster = {fits}" if fits else "no clients_per_cluster at all"
            raise ValueError(f"{error}; {data.name} ({held}) fits {limit}") from None

    def _fitted_sizes(
        self, seed: int, placement: ByzantinePlacement | None, data: LabelledImages, clients_per_cluster: int
    ) -> tuple[int, int, int]:
        """``(train, validation, test)`` per client with ``clients_per_cluster``."""
        ids, _ = (placement or ByzantinePlacement()).place(self.clusters, clients_per_cluster)
        train_groups, test_groups, proportions = self._groups(seed, data)
        weights = proportions[ids]
        return self._sizes(
            group_sizes(train_groups, weights.shape[1]), group_sizes(test_groups, weights.shape[1]), weights, data
        )

    def prepared_redeal(self, task: Task, seed: int, data: LabelledImages | None = None) -> RedealCache:
        """What :meth:`reshuffle` reuses every epoch for ``task`` (built with ``seed``):
        its layout, and the source train images normalised at every quarter turn its
        clients use (left out when that stack would pass
        :data:`~robust_pfl.engine.tasks.transforms.PREPARED_LIMIT_BYTES`)."""
        data = self.load(data)
        ids = task.cluster_ids.cpu()
        quarters = self._turns(ids, task.train.samples_per_client).unique().tolist()
        images = None
        if PreparedImages.fits(data.train_images, quarters):
            stats = normalization_stats(self.normalization, data.train_images)
            images = PreparedImages(data.train_images, stats, quarters)
        return RedealCache(seed, ids, self._layout(seed, ids, data), images)

    def reshuffle(self, task: Task, epoch: int, seed: int, data: LabelledImages | None = None,
                  prepared: RedealCache | None = None, out: Tensor | None = None) -> ClientData:
        """The train split of ``task`` (built by this builder with ``seed``) dealt
        afresh for ``epoch``, as the official code re-deals MNIST every epoch.

        Same shapes, clients, cluster transforms, label quotas and dealing rule; the
        samples come from the source train split minus every client's validation
        samples (which stay fixed), drawn from the ``images/deal/train/epoch-<epoch>``
        stream.  Validation and test are unchanged (reuse ``task.validation`` /
        ``task.test``).  Pass ``data`` to avoid reloading the data set every epoch, and
        ``prepared`` (:meth:`prepared_redeal`, for this task and seed) to reuse the
        layout and gather the normalised, turned samples instead of computing them again
        (the same values), into ``out`` (a tensor of the train inputs' shape that nothing
        else reads any more) when given.

        Raises:
            ValueError: ``epoch < 0``, or ``task`` does not match this builder and
                ``seed``.
        """
        data = self.load(data)
        index = self.epoch_index(task, epoch, seed, data, prepared)
        reusable = prepared is not None and prepared.serves(task, seed)
        stats = normalization_stats(self.normalization, data.train_images)
        train = self._materialise(
            (data.train_images, data.train_labels), index, task.cluster_ids.cpu(), data.num_classes, stats,
            task.train.inputs.dtype, prepared.images if reusable else None, out,
        )
        return ClientData(train.inputs.to(task.train.inputs.device), train.targets.to(task.train.targets.device))

    def epoch_index(self, task: Task, epoch: int, seed: int, data: LabelledImages | None = None,
                    prepared: RedealCache | None = None) -> Tensor:
        """The source indices ``[N, n]`` of :meth:`reshuffle`'s train split for ``epoch``."""
        _integer("epoch", epoch, 0)
        data = self.load(data)
        ids = task.cluster_ids.cpu()
        layout = prepared.layout if prepared is not None and prepared.serves(task, seed) else self._layout(seed, ids, data)
        if tuple(layout.train.shape) != tuple(task.train.targets.shape):
            raise ValueError(
                f"task: its train split is {list(task.train.targets.shape)} but this ImageTask "
                f"with seed {seed} deals {list(layout.train.shape)}; reshuffle the task it built"
            )
        groups = layout.groups.clone()
        groups[layout.validation.reshape(-1)] = -1
        stream = generator(seed, f"images/deal/train/epoch-{epoch}")
        (index,) = deal(groups, [layout.quotas], stream, self.partition)
        return index

    def gathered_split(self, task: Task, index: Tensor, inputs: Tensor, data: LabelledImages | None = None) -> ClientData:
        """The train split of the source indices ``index`` whose inputs the caller has
        gathered into ``inputs`` (from :meth:`prepared_redeal`'s images, by
        :meth:`turns`), with its targets, on the task's device."""
        data = self.load(data)
        ids = task.cluster_ids.cpu()
        shift = self._label_shift(ids)
        targets = relabel(data.train_labels, index, shift, data.num_classes)
        return ClientData(inputs.to(task.train.inputs.device), targets.to(task.train.targets.device))

    def _label_shift(self, ids: Tensor) -> Tensor:
        """Each client's label shift ``[N]``: its cluster under ``private_label``, else 0."""
        return ids if self.kind == "private_label" else torch.zeros_like(ids)

    def turns(self, task: Task) -> Tensor:
        """Quarter turns ``[N, n]`` of every train sample of ``task``'s clients."""
        return self._turns(task.cluster_ids.cpu(), task.train.samples_per_client)

    # -- layout ---------------------------------------------------------------------------
    def _layout(self, seed: int, ids: Tensor, data: LabelledImages) -> _Layout:
        """Source indices of every client's train, validation and test samples."""
        train_groups, test_groups, proportions = self._groups(seed, data)
        weights = proportions[ids]  # [N, G]: each client's share of each group
        train, validation, test = self._sizes(
            group_sizes(train_groups, weights.shape[1]), group_sizes(test_groups, weights.shape[1]), weights, data
        )
        quotas = [largest_remainder(n, weights) for n in (train, validation)]
        train_index, validation_index = deal(train_groups, quotas, generator(seed, "images/deal/train"), self.partition)
        (test_index,) = deal(
            test_groups, [largest_remainder(test, weights)], generator(seed, "images/deal/test"), self.partition
        )
        return _Layout(train_index, validation_index, test_index, train_groups, quotas[0])

    def _groups(self, seed: int, data: LabelledImages) -> tuple[Tensor, Tensor, Tensor]:
        """Groups of the train and test samples and each cluster's share of every group
        ``[K, G]`` (rows sum to 1)."""
        classes = data.num_classes
        if self.kind == "private_label" and self.clusters > classes:
            raise ValueError(
                f"clusters must be <= num_classes ({classes}) for kind='private_label' (distinct label "
                f"shifts), got {self.clusters}"
            )
        if self.kind == "label_skew":
            membership = label_sets(self.clusters, self._labels_per_cluster(classes), classes)
            stream = generator(seed, "images/label-skew")
            train = label_skew_groups(data.train_labels, membership, stream)
            test = label_skew_groups(data.test_labels, membership, stream)
            return train, test, torch.eye(self.clusters, dtype=torch.float64)
        if self.kind == "dirichlet":
            proportions = dirichlet_proportions(self.clusters, classes, self.dirichlet_alpha, seed)
            return data.train_labels, data.test_labels, proportions
        if self.kind in ROTATION_KINDS and data.image_shape[1] != data.image_shape[2]:
            raise ValueError(
                f"kind={self.kind!r} needs square images to rotate by 90 degrees; {data.name} images "
                f"are {data.image_shape[1]}x{data.image_shape[2]}"
            )
        one_pool = torch.ones(self.clusters, 1, dtype=torch.float64)
        return torch.zeros_like(data.train_labels), torch.zeros_like(data.test_labels), one_pool

    def _labels_per_cluster(self, classes: int) -> int:
        """``L`` of the label-skew task, checked against the data set's classes."""
        labels = self.labels_per_cluster if self.labels_per_cluster is not None else classes // self.clusters
        if labels < 1:
            raise ValueError(
                f"clusters must be <= num_classes ({classes}) for kind='label_skew' with the default "
                f"labels_per_cluster (num_classes // clusters), got {self.clusters}"
            )
        if labels > classes:
            raise ValueError(f"labels_per_cluster must be <= num_classes ({classes}), got {labels}")
        membership = label_sets(self.clusters, labels, classes)
        if torch.unique(membership, dim=0).shape[0] < self.clusters:
            raise ValueError(
                f"labels_per_cluster={labels} gives some of the {self.clusters} clusters identical label "
                f"sets (of {classes} classes); choose labels_per_cluster so that the sets "
                f"(k * L + j) mod C differ"
            )
        return labels

    def _sizes(
        self, train_available: Tensor, test_available: Tensor, weights: Tensor, data: LabelledImages
    ) -> tuple[int, int, int]:
        """``(train, validation, test)`` samples per client (module docstring)."""
        clients = weights.shape[0]
        fraction = self.validation_fraction
        fixed_validation = self.validation_per_client

        def share_split(share: int) -> tuple[int, int]:
            validation = fixed_validation if fixed_validation is not None else max(1, round(fraction * share))
            return share - validation, validation

        most_train = largest_share(train_available, weights, lambda share: (share,))
        if self.train_per_client is None:
            train, validation = share_split(largest_share(train_available, weights, share_split))
            if train < 1:
                raise _TooManyClients(
                    f"clients_per_cluster: {clients} clients leave at most {most_train} {data.name} train "
                    f"samples per client, too few for a train and a validation sample each"
                )
        else:
            train = self.train_per_client
            validation = fixed_validation
            if validation is None:
                validation = max(1, round(train * fraction / (1 - fraction)))
            # a count past the whole split cannot fit, and would overflow the integer
            # quotas (int64) before the split is even consulted
            if train + validation > int(train_available.sum()) or not fits(
                    [largest_remainder(n, weights) for n in (train, validation)], train_available):
                raise ValueError(
                    f"train_per_client: {train} train + {validation} validation samples for each of {clients} "
                    f"clients do not fit in the {data.name} train split (at most {most_train} per client "
                    f"in all for kind={self.kind!r})"
                )
        if self.test_per_client is None:
            test = largest_share(test_available, weights, lambda share: (share,))
            if test < 1:
                raise _TooManyClients(
                    f"clients_per_cluster: {clients} clients leave no {data.name} test sample per client"
                )
        else:
            test = self.test_per_client
            if test > int(test_available.sum()) or not fits([largest_remainder(test, weights)], test_available):
                most = largest_share(test_available, weights, lambda share: (share,))
                raise ValueError(
                    f"test_per_client: {test} samples for each of {clients} clients do not fit in the "
                    f"{data.name} test split (at most {most} per client for kind={self.kind!r})"
                )
        return train, validation, test

    # -- transforms -------------------------------------------------------------------------
    def _turns(self, ids: Tensor, samples: int) -> Tensor:
        """Quarter turns ``[N, samples]`` of every client's samples."""
        if self.kind not in ROTATION_KINDS:
            return torch.zeros(ids.numel(), samples, dtype=torch.long)
        own = (ids * self.rotation_step % 4).unsqueeze(1)
        if self.kind == "rotation":
            return own.expand(-1, samples)
        other = ((ids + 1) % self.clusters * self.rotation_step % 4).unsqueeze(1)
        first = round(self.mixture_weight * samples)
        return torch.where(torch.arange(samples) < first, own, other)

    def _materialise(
        self,
        source: tuple[Tensor, Tensor],
        index: Tensor,
        ids: Tensor,
        classes: int,
        stats: tuple[Tensor, Tensor],
        dtype: torch.dtype,
        prepared: PreparedImages | None = None,
        out: Tensor | None = None,
    ) -> ClientData:
        """One split's stacked data with each client's cluster transform."""
        shift = self._label_shift(ids)
        images, labels = source
        turns = self._turns(ids, index.shape[1])
        return materialise(images, labels, index, turns, shift, classes, stats, dtype, prepared, out)


# -- validation helpers ------------------------------------------------------------------------
def _choice(name: str, value: Any, allowed: tuple[Any, ...] | list[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _integer(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
