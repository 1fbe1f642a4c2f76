"""What a task hands the federation: objective, stacked data, hidden clusters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.metrics import accuracy, negative_log_likelihood
from robust_pfl.engine.objectives import Objective
from robust_pfl.engine.placement import ByzantinePlacement


Predictor = Callable[[Tensor], Tensor]
"""Inputs ``[N, b, ...]`` to log-probabilities ``[N, b, C]`` (one row per client)."""


@dataclass
class Task:
    """A clustered learning task.

    Attributes:
        objective: every client's loss.
        train: training data ``[N, n, ...]`` (Byzantine clients hold data too: an
            attacker may use its honest gradient, e.g. bit flip).
        validation: held-out data per client from the same distribution (for
            hyper-parameter selection; never the reported test metric).
        test: held-out data per client for the reported metrics.
        cluster_ids: ``[N]`` hidden cluster of each client.
        byzantine: ``[N]`` Byzantine mask.
        optima: ``[K, d]`` each cluster's minimiser, where known (synthetic tasks).
        num_classes: classes of a classification task (``None`` for regression); data
            attacks such as label flipping need it.
    """

    objective: Objective
    train: ClientData
    validation: ClientData
    test: ClientData
    cluster_ids: Tensor
    byzantine: Tensor
    optima: Tensor | None = None
    num_classes: int | None = None

    def to(self, device: torch.device | str) -> "Task":
        """The same task with every tensor on ``device``."""

        def move(data: ClientData) -> ClientData:
            return ClientData(data.inputs.to(device), data.targets.to(device))

        return Task(
            self.objective,
            move(self.train),
            move(self.validation),
            move(self.test),
            self.cluster_ids.to(device),
            self.byzantine.to(device),
            None if self.optima is None else self.optima.to(device),
            self.num_classes,
        )

    def log_probs(self, models: Tensor, data: ClientData | Batch, predictor: Predictor | None = None) -> Tensor:
        """``[N, b, C]`` class log-probabilities of each client's ``models[N, d]`` on
        its rows of ``data``: ``predictor(data.inputs)`` when given (KNN-Per's
        mixture), else ``log_softmax`` of the models' outputs."""
        if predictor is not None:
            return predictor(data.inputs)
        return torch.log_softmax(self.objective.paired_outputs(models, data), dim=-1)

    def evaluate(self, models: Tensor, predictor: Predictor | None = None) -> dict[str, Tensor]:
        """Per-client metrics ``{name: [N]}`` of personalised ``models[N, d]``, each on
        the client's own split.

        Regression: the objective's loss on train, validation and test.
        Classification (``num_classes`` set): ``*_loss`` is the cross-entropy of the
        predicted class distribution and ``*_accuracy`` its accuracy, on validation
        and test (plus the training objective as ``train_loss``).  ``predictor``, if
        given, maps inputs ``[N, b, ...]`` to log-probabilities ``[N, b, C]`` and
        replaces ``log_softmax`` of the models' outputs (KNN-Per's mixture).
        """
        metrics = {"train_loss": self.objective.paired_losses(models, self.train)}
        for split, data in (("validation", self.validation), ("test", self.test)):
            if self.num_classes is None:
                metrics[f"{split}_loss"] = self.objective.paired_losses(models, data)
                continue
            log_probs = self.log_probs(models, data, predictor)
            metrics[f"{split}_loss"] = negative_log_likelihood(log_probs, data.targets)
            metrics[f"{split}_accuracy"] = accuracy(log_probs, data.targets)
        if self.optima is not None:
            target = self.optima.to(models)[self.cluster_ids]
            metrics["param_error"] = (models - target).pow(2).sum(-1)
        return metrics


def place_clients(
    clusters: int, honest_per_cluster: int, byzantine_total: int = 0, byzantine_per_cluster: int = 0
) -> tuple[Tensor, Tensor]:
    """Cluster ids and Byzantine mask: ``byzantine_per_cluster`` Byzantine clients in
    every cluster plus ``byzantine_total`` spread round-robin (see
    :class:`robust_pfl.engine.placement.ByzantinePlacement` for fractions and cluster choice)."""
    return ByzantinePlacement(byzantine_total, byzantine_per_cluster).place(clusters, honest_per_cluster)
