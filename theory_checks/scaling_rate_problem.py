"""The instance of the Thm 3.3 / 3.4 rate studies: Werner et al.'s synthetic linear
regression (Sec. 4.1) with cluster-shared data, its constants (``L``, ``mu``,
``sigma``, ``Delta``, ``F_0``) and the learning rate the theorems prescribe for a
horizon ``T``.  :mod:`theory_checks.scaling_rates` says why each choice is made."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

import attacks
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.tasks import SyntheticLinearRegression, Task
from theory_checks import bounds
from theory_checks.least_squares import least_squares


@dataclass(frozen=True)
class RateSizes:
    """Sizes of the Thm 3.3 / 3.4 sweeps (:mod:`theory_checks.scaling_rates` gives the
    reasons for the defaults)."""

    clusters: int = 2
    clients_per_cluster: int = 8
    dim: int = 5
    samples_per_client: int = 40
    batch_size: int = 4
    noise: float = 0.1
    optimum_scale: float = 1.0
    horizons: tuple[int, ...] = (32, 64, 128, 256, 512)
    repeats: int = 8
    lr_cap: float = 0.2
    byzantine_per_cluster: int = 1
    task_seed: int = 0
    #: Run Thm 3.4's attacked sweep and quantile-radius runs when the clean runs'
    #: hypotheses already fail (they then decide the status: the extra runs are
    #: information only).
    extras_when_unmet: bool = True


RATE_BUDGETS: dict[str, RateSizes] = {
    # four repeats: both statements' status is decided by hypotheses measured at the
    # start (Thm 3.3's noise at x_0, Thm 3.4's momenta at round 1), not by the fit;
    # the quick budget stops Thm 3.4 there
    "quick": RateSizes(repeats=4, extras_when_unmet=False),
    "full": RateSizes(horizons=(32, 64, 128, 256, 512, 1024, 2048, 4096), repeats=10),
}


@dataclass(frozen=True)
class RateProblem:
    """The task with cluster-shared data (``train``) and its constants: ``L``, ``mu``,
    ``sigma`` per sample and per batch (``rho = sigma / sqrt(b)``, Lemma 7),
    ``Delta``, ``delta_i = n_i / N`` and ``beta = B / N``."""

    task: Task = field(repr=False)
    train: ClientData = field(repr=False)
    smoothness: float
    strong_convexity: float
    sample_sigma: float
    batch_sigma: float
    separation: float
    cluster_fraction: float
    byzantine_fraction: float
    batch_size: int

    @property
    def base_error(self) -> float:
        """``E = rho^2 / n_i + rho^3 / Delta`` (eq. 28 without ``beta``)."""
        n = self.cluster_fraction * self.task.cluster_ids.numel()
        return float(bounds.clustering_error(self.batch_sigma, self.separation, n))

    @property
    def cluster_size(self) -> int:
        return round(self.cluster_fraction * self.task.cluster_ids.numel())


def rate_problem(sizes: RateSizes, byzantine_per_cluster: int = 0) -> RateProblem:
    """Build the task (float64), share every cluster's data and estimate ``L``,
    ``mu``, ``sigma`` and ``Delta`` from the honest clients' data."""
    placement = ByzantinePlacement(per_cluster=byzantine_per_cluster)
    task = _builder(sizes).build(sizes.task_seed, dtype=torch.float64, placement=placement)
    train = shared_cluster_data(task.train, task.cluster_ids)
    honest = ~task.byzantine
    inputs, targets = train.inputs[honest], train.targets[honest]
    eigenvalues = torch.linalg.eigvalsh(inputs.transpose(1, 2) @ inputs / inputs.shape[1])
    minimisers = least_squares(inputs, targets)  # [H, d]
    per_sample = inputs * (inputs @ minimisers.unsqueeze(-1) - targets.unsqueeze(-1))  # [H, m, d]
    sample_sigma = math.sqrt(float((per_sample - per_sample.mean(1, keepdim=True)).square().sum(-1).mean(-1).max()))
    separation = _gradient_separation(task, ClientData(inputs, targets), task.cluster_ids[honest], minimisers)
    n_clients = task.cluster_ids.numel()
    return RateProblem(
        task, train, float(eigenvalues[:, -1].max()), float(eigenvalues[:, 0].min()), sample_sigma,
        sample_sigma / math.sqrt(sizes.batch_size), separation, sizes.clients_per_cluster / n_clients,
        int(task.byzantine.sum()) / n_clients, sizes.batch_size,
    )


def shared_cluster_data(train: ClientData, cluster_ids: Tensor) -> ClientData:
    """Every client gets its cluster's first client's data set (one gather)."""
    clusters = int(cluster_ids.max()) + 1
    first = torch.full((clusters,), cluster_ids.numel(), dtype=torch.long)
    first = first.scatter_reduce(0, cluster_ids, torch.arange(cluster_ids.numel()), "amin")
    source = first[cluster_ids]
    return ClientData(train.inputs[source], train.targets[source])


def _gradient_separation(task: Task, honest_data: ClientData, ids: Tensor, minimisers: Tensor) -> float:
    """``min ||grad f_i(x) - grad f_j(x)||`` over cross-cluster honest pairs, at the
    origin and at every client's minimiser (Assumption 5 with ``D = 0``)."""
    models = torch.cat([minimisers.new_zeros(1, minimisers.shape[1]), minimisers])
    gradients = task.objective.cross_gradients(models, honest_data)  # [M, H, d]
    distances = torch.cdist(gradients, gradients)  # [M, H, H]
    cross = ids.unsqueeze(0) != ids.unsqueeze(1)
    return float(distances[:, cross].min())


def learning_rate(problem: RateProblem, gap: float, horizon: int, sizes: RateSizes) -> float:
    """``eta_T = min(1/L, c sqrt(F_0 / (L T E)))`` (Thm 3.4's condition on ``eta``) with
    the hidden constant ``c`` such that ``eta = lr_cap / L`` at the smallest horizon."""
    smallest = min(sizes.horizons)
    lipschitz, error = problem.smoothness, problem.base_error
    constant = sizes.lr_cap * math.sqrt(smallest * error / (gap * lipschitz))
    return min(1.0 / lipschitz, constant * math.sqrt(gap / (lipschitz * horizon * error)))


def federation_for(problem: RateProblem, seed: int, attack: str | None = None) -> Federation:
    """A federation on the shared data (as :func:`robust_pfl.experiments.build_federation`
    builds one), batches of ``b``, seeded by ``seed``, with the named attack."""
    task = problem.task
    return Federation(
        objective=task.objective, train=problem.train, cluster_ids=task.cluster_ids, byzantine=task.byzantine,
        seed=seed, batch_size=problem.batch_size, attack=None if attack is None else attacks.build(attack),
    )


def optimality_gap(problem: RateProblem, federation: Federation) -> float:
    """``F_0 = min_i f_i(x_0) - f_i*`` over honest clients, at the federation's start."""
    honest = federation.honest
    start = federation.init_params(1).expand(federation.clients, -1)
    data = problem.train
    inputs, targets = data.inputs[honest], data.targets[honest]
    minimisers = least_squares(inputs, targets)
    objective = federation.objective
    losses = objective.paired_losses(start[honest], ClientData(inputs, targets))
    optimal = objective.paired_losses(minimisers, ClientData(inputs, targets))
    return float((losses - optimal).min())


def independent_data_floor(sizes: RateSizes) -> dict[str, float]:
    """With each client's own noisy data (the task as built): ``mean_i ||grad
    f_i(xbar*)||^2`` over honest clients at their cluster's pooled minimiser ``xbar*``,
    the value the left side of eq. (23) tends to once a cluster's models agree."""
    task = _builder(sizes).build(sizes.task_seed, dtype=torch.float64)
    inputs, targets, ids = task.train.inputs, task.train.targets, task.cluster_ids
    clusters = int(ids.max()) + 1
    # pooled normal equations per cluster: sums of A_i^T A_i and A_i^T y_i
    gram = torch.zeros(clusters, sizes.dim, sizes.dim, dtype=torch.float64).index_add_(
        0, ids, inputs.transpose(1, 2) @ inputs)
    moment = torch.zeros(clusters, sizes.dim, dtype=torch.float64).index_add_(
        0, ids, (inputs.transpose(1, 2) @ targets.unsqueeze(-1)).squeeze(-1))
    pooled = torch.linalg.solve(gram, moment)  # [K, d]
    gradients = task.objective.paired_gradients(pooled[ids], task.train)
    return {"floor": float(gradients.square().sum(-1).mean())}


def _builder(sizes: RateSizes) -> SyntheticLinearRegression:
    """Sec. 4.1's task with Gaussian optima and label noise (Werner et al. Sec. 4.1)."""
    return SyntheticLinearRegression(
        clusters=sizes.clusters, clients_per_cluster=sizes.clients_per_cluster, dim=sizes.dim,
        samples_per_client=sizes.samples_per_client, scale=sizes.optimum_scale, optimum="gaussian",
        noise=sizes.noise,
    )
