"""An instance on which the momentum-separation hypothesis holds at every round: Werner
et al.'s Assumption 9 (Thm 3.4) and the workshop paper's Assumption 6 (Thms 3-4),
while the bounds still decay in ``T``, so that a broken algorithm violates them.

Why the family is one-sided.  On an ``L``-smooth objective bounded below, the
theorems' learning rate drives ``E||grad f_i||^2`` to 0, and with it every expected
momentum ``E m_i,t``.  If *both* clusters converged, their momenta would meet and
``||E m_i,t - E m_j,t|| >= Delta`` would fail; keeping every cluster's gradient away
from 0 for ``T`` rounds needs ``F_0`` growing like ``eta T``, and then the bounds
(``sqrt(L F_0 E / T) + L F_0 / T`` and the workshop's eq. 4) stay flat while the
measured quantity stays near the squared slope: a frozen model, FedAvg or the right
algorithm all meet them alike (such a check cannot fail).  The separation needs only
*one* cluster to keep a large momentum: ``||E m_0 - E m_1|| >= ||E m_1|| - ||E
m_0||``.  So cluster 1 (the *runner*) walks down a long ramp started ``h eta T + m``
up, while cluster 0 (the *anchored* cluster, whose clients the bounds are checked on)
starts at a fixed height ``a`` on its own ramp: its ``F_0`` does not depend on ``T``,
its bounds decay, and a model that does not descend violates them.

The losses: ``K = 2`` clusters whose losses are ramps in *opposed* directions ``u_0 =
e_1`` and ``u_1 = (e_2 - e_1) / sqrt 2`` (135 degrees apart).  Client ``i`` of cluster
``k`` holds ``m`` samples ``(u_k, xi_s)`` (the cluster's shared data set, so ``f_i`` is
the cluster's loss and momenta are iid within a cluster, Assumption 8) with per-sample
loss

    l(x; u, xi) = softplus(s <u, x>) / s + <xi, x>,

the noise ``xi_s`` Gaussian and centred over the cluster's samples.  Then ``f_i(x) =
softplus(s <u_k, x>) / s``: bounded below by ``f* = 0``, ``L = s / 4``, gradient
``sigmoid(s <u_k, x>) u_k``; the per-sample gradient noise is ``xi_s`` at every ``x``
(Assumption 6 with ``sigma^2 = mean_s ||xi_s||^2`` exactly).  All clients start at
``x_0 = a u_0 + b e_2`` with ``b`` chosen so that cluster 1 starts ``<u_1, x_0> = h eta
T + m`` up its ramp: cluster 0's ``F_0 = softplus(s a) / s`` is fixed, and cluster 1's
slope stays above ``sigmoid(s m)`` for ``T`` rounds, so ``E m_1`` stays near ``u_1``
while ``E m_0`` shrinks to 0 (the momenta about 1 apart).

Why opposed.  Cluster 1's descent direction ``-u_1`` climbs cluster 0's ramp.  A model
shared by both clusters (no clustering, a wrong partition, a random assignment) steps
along the mean of their gradients, whose ``u_0`` component ``sigmoid(s <u_0, x>) -
sigmoid(.) / sqrt 2`` vanishes where cluster 0's slope is ``1 / sqrt 2``: the shared
model stops there, with the anchored clients' squared gradient near ``1/2`` at every
``T``, and violates every decaying bound.  With orthogonal ramps a shared model
descended cluster 0's ramp at half speed with the same exponent, so a clustering bound
could not tell clustering from none.  The separation hypotheses only get easier:
``||grad f_0 - grad f_1||^2 = s_0^2 + s_1^2 + sqrt 2 s_0 s_1 >= s_1^2``.

The family's other constants, which the rate studies sweep.  ``Delta``: the runners'
loss is ``c^2 softplus(s <u_k, x> / c) / s``, slope ``c`` far up and curvature at most
``s / 4`` as the anchored ramp's, so ``c`` moves the separation without moving ``L``
(the runners start ``c`` times as high).  ``K``: runner ``k = 1 .. K - 1`` has the ramp
``u_k = (e_{k+1} - e_1) / sqrt 2``, opposed to ``u_0`` and a unit from every other
runner's, so the momenta stay ``c`` apart pairwise.  ``delta_0``: the runners' clients
(by default they share ``n_0`` clients, so that ``delta_0 = 1/2`` at every ``K``).
The hypotheses are read with ``delta_0``: Thm 3.1 bounds cluster ``i``'s error under
``Delta >~ rho / delta_i`` for that cluster, and the bounds are checked on cluster 0.

Each theorem's learning rate is its own formula at cluster 0's ``F_0`` (Thm 3.4: ``eta
= min(1/L, sqrt(F_0 / (L T E)))``; the workshop's eq. 3 and Thm 4's), so ``eta`` falls
with ``T`` and the ``T^(-1/2)`` terms of the bounds carry weight; ``alpha`` is ``0.9``
or the smallest value the theorem allows (``L eta`` for Thm 3.4, ``3 L eta`` for the
workshop), whichever is larger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import Tensor
from torch.nn.functional import softplus

from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.objectives import Objective, write_into
from theory_checks import bounds
from theory_checks.scaling_rates import PRINTED_MC


class RampObjective(Objective):
    """``mean_s c_s^2 softplus(s <u_s, x> / c_s) / s + <xi_s, x>`` with each sample's
    input the concatenation ``[u_s, xi_s, c_s]`` (``2 d + 1`` numbers): a ramp along
    the unit direction ``u_s`` whose slope far up is ``c_s`` and whose curvature is at
    most ``s / 4`` whatever ``c_s`` (so a steeper ramp moves the clusters' gradients
    apart, ``Delta``, without moving ``L``).  Closed-form gradients, so the rate
    studies' per-round statistics cost little.  Every client starts at ``start``."""

    def __init__(self, start: Tensor, sharpness: float = 1.0) -> None:
        self.start = start
        self.sharpness = sharpness
        self.dim = start.numel()

    def _split(self, inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``[..., d]`` directions, ``[..., d]`` noise and ``[...]`` slopes."""
        return inputs[..., : self.dim], inputs[..., self.dim : 2 * self.dim], inputs[..., 2 * self.dim]

    def _ramp(self, height: Tensor, slope: Tensor) -> Tensor:
        """``c^2 softplus(s h / c) / s`` at heights ``h = <u, x>``."""
        return slope.square() * softplus(self.sharpness * height / slope) / self.sharpness

    def _ramp_slope(self, height: Tensor, slope: Tensor) -> Tensor:
        """Its derivative along ``u``: ``c sigmoid(s h / c)``."""
        return slope * torch.sigmoid(self.sharpness * height / slope)

    def loss(self, params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        direction, noise, slope = self._split(inputs)
        return (self._ramp(direction @ params, slope) + noise @ params).mean()

    def init(self, count: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
        return self.start.to(dtype).expand(count, -1).clone()

    def paired_gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None,
                         blend: float | None = None) -> Tensor:
        direction, noise, slope = self._split(batch.inputs)  # [N, b, d], [N, b, d], [N, b]
        weight = self._ramp_slope(torch.einsum("nbd,nd->nb", direction, params), slope)
        gradients = (weight.unsqueeze(-1) * direction + noise).mean(1)
        return write_into(out, gradients, blend)

    def cross_gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None) -> Tensor:
        direction, noise, slope = self._split(batch.inputs)  # [N, b, d], [N, b, d], [N, b]
        weight = self._ramp_slope(torch.einsum("nbd,md->mnb", direction, params), slope)  # [M, N, b]
        gradients = torch.einsum("mnb,nbd->mnd", weight, direction) / direction.shape[1] + noise.mean(1)
        return write_into(out, gradients)

    def cross_losses(self, params: Tensor, batch: Batch) -> Tensor:
        direction, noise, slope = self._split(batch.inputs)
        ramp = self._ramp(torch.einsum("nbd,md->mnb", direction, params), slope)
        return (ramp + torch.einsum("nbd,md->mnb", noise, params)).mean(-1)

    def paired_losses(self, params: Tensor, batch: Batch) -> Tensor:
        return torch.diagonal(self.cross_losses(params, batch))


Method = Literal["mc", "pfl_tc", "pdl_tc"]

#: Per-sample noise scale per method: each theorem's step size puts its sweep in the
#: regime where its bound's leading terms carry weight at these horizons (Thm 3.4's
#: ``sqrt(L F_0 E / T)`` above ``L F_0 / T``; the workshop's rates, whose fifth-root
#: terms carry constants 21600 K^2 and 1968, stay in their asymptotic slope only at
#: smaller noise).  Every level meets the separation hypotheses (measured on the runs).
METHOD_NOISE: dict[str, float] = {"mc": 0.3, "pfl_tc": 0.05, "pdl_tc": 0.1}


@dataclass(frozen=True)
class SeparatedSizes:
    """Sizes of the one-sided separated family.  ``anchor``: cluster 0's start height
    ``a`` (fixed ``F_0``); ``headroom`` ``h`` and ``margin`` ``m``: every runner starts
    ``c (h eta T + m)`` up its ramp; ``clusters``: ``K``, the anchored cluster and ``K -
    1`` runners; ``runner_clients``: clients in each runner cluster (``None``: the
    runners share ``clients_per_cluster`` clients equally, so the anchored cluster is
    half the federation, ``delta_0 = 1/2``, at every ``K``); ``slope``: the runners'
    slope ``c`` far up their ramps (the separation ``Delta``); ``alpha``: the momentum
    parameter's floor (MC's
    warm-started centres follow ``E m``, which moves ``alpha (1 - alpha)^(t-1)`` in round
    ``t`` from momenta started at 0, eq. 29, and needs a large ``alpha`` to clear the
    separation from round 1); ``noise``: ``None`` takes :data:`METHOD_NOISE`."""

    clients_per_cluster: int = 8
    dim: int = 5
    clusters: int = 2
    runner_clients: int | None = None
    slope: float = 1.0
    samples: int = 40
    batch_size: int = 4
    noise: float | None = None
    sharpness: float = 1.0
    alpha: float = 0.9
    anchor: float = 1.0
    headroom: float = 1.5
    margin: float = 4.0
    horizons: tuple[int, ...] = (64, 128, 256, 512, 1024)
    repeats: int = 3
    task_seed: int = 0
    instance_horizon: int = 64

    def __post_init__(self) -> None:
        if self.instance_horizon not in self.horizons:
            raise ValueError(f"instance_horizon {self.instance_horizon} must be one of the horizons {self.horizons}")
        if not 2 <= self.clusters <= self.dim:
            raise ValueError(f"clusters must be in [2, dim = {self.dim}] (one ramp direction each), got {self.clusters}")
        if self.runner_clients is None and self.clients_per_cluster % (self.clusters - 1):
            raise ValueError(f"clients_per_cluster {self.clients_per_cluster} must split equally among the "
                             f"{self.clusters - 1} runner clusters, or set runner_clients")
        if self.runner_clients is not None and self.runner_clients < 1:
            raise ValueError(f"runner_clients must be at least 1, got {self.runner_clients}")
        if not self.slope > 0:
            raise ValueError(f"slope must be positive, got {self.slope}")

    @property
    def clients_per_runner(self) -> int:
        """Clients in each runner cluster."""
        if self.runner_clients is not None:
            return self.runner_clients
        return self.clients_per_cluster // (self.clusters - 1)

    def for_method(self, method: str) -> "SeparatedSizes":
        """These sizes with ``method``'s noise where none is set."""
        return self if self.noise is not None else replace(self, noise=METHOD_NOISE[method])


SEPARATED_BUDGETS: dict[str, SeparatedSizes] = {
    "quick": SeparatedSizes(),
    "full": SeparatedSizes(horizons=(64, 128, 256, 512, 1024, 2048), repeats=4, instance_horizon=512),
}
#: The anchored cluster, whose clients every bound is checked on.
ANCHORED = 0


@dataclass(frozen=True)
class SeparatedProblem:
    """The family's data and constants: ``L = s/4``, ``sigma`` per sample (exact),
    ``rho = sigma / sqrt(b)`` (Lemma 7), ``delta_i``, and each theorem's settings.

    ``delta_i`` and the hypotheses are the anchored cluster's: Thm 3.1 (and with it
    Thm 3.4's clustering) bounds cluster ``i``'s error under ``Delta >~ rho /
    delta_i`` for that ``i``, and the bounds are checked on the anchored clients only."""

    train: ClientData = field(repr=False)
    cluster_ids: Tensor = field(repr=False)
    sizes: SeparatedSizes
    smoothness: float
    sample_sigma: float

    @property
    def batch_sigma(self) -> float:
        return self.sample_sigma / math.sqrt(self.sizes.batch_size)

    @property
    def clusters(self) -> int:
        return self.sizes.clusters

    @property
    def cluster_fraction(self) -> float:
        """``delta_0 = n_0 / N``, the anchored cluster's share of the clients."""
        return self.sizes.clients_per_cluster / self.cluster_ids.numel()

    @property
    def separation(self) -> float:
        """``||E m_k - E m_0||`` once cluster 0 has converged: the runners' slope
        (``Delta`` in the learning rates and the radius; the runs measure the separation
        they meet)."""
        return self.sizes.slope

    @property
    def anchored(self) -> Tensor:
        """``[N]`` mask of the anchored cluster's clients (where the bounds are checked)."""
        return self.cluster_ids == ANCHORED

    def optimality_gap(self) -> float:
        """The anchored cluster's ``F_0 = f_i(x_0) - f_i* = softplus(s a) / s`` (``f* = 0``),
        the same at every horizon."""
        s = self.sizes.sharpness
        return float(softplus(torch.tensor(s * self.sizes.anchor, dtype=torch.float64)) / s)

    def frozen_error(self) -> float:
        """``||grad f_i(x_0)||^2 = sigmoid(s a)^2`` for an anchored client: the measured
        quantity of a model that never moves (the negative control), at every ``T``."""
        return float(torch.sigmoid(torch.tensor(self.sizes.sharpness * self.sizes.anchor, dtype=torch.float64))) ** 2

    def base_error(self) -> float:
        """Thm 3.1's ``E = rho^2/n_i + rho^3/Delta`` at the nominal separation."""
        return float(bounds.clustering_error(self.batch_sigma, self.separation, self.sizes.clients_per_cluster))

    def learning_rate(self, method: str, horizon: int) -> float:
        """Each theorem's learning rate at the anchored cluster's ``F_0`` (constants 1):
        Thm 3.4's ``min(1/L, sqrt(F_0 / (L T E)))``; the workshop's eq. (3) (PFL-TC) and
        Thm 4's (PDL-TC), ``min(1/(3L), (2 F_0 / (c_2 L rho^2 T / n))^(1/2), (2 F_0 /
        (c_3 L^1.5 rho^3 T / Delta))^(2/5))`` with ``c_2, c_3 = 60, 21600 K^2`` and ``48,
        1968``."""
        smoothness, gap, rho = self.smoothness, self.optimality_gap(), self.batch_sigma
        n, separation = self.sizes.clients_per_cluster, self.separation
        if method == "mc":
            return min(1.0 / smoothness, math.sqrt(gap / (smoothness * horizon * self.base_error())))
        second, third = (60.0, 21600.0 * self.clusters**2) if method == "pfl_tc" else (48.0, 1968.0)
        return min(1.0 / (3.0 * smoothness),
                   (2.0 * gap / (second * smoothness * rho**2 * horizon / n)) ** 0.5,
                   (2.0 * gap / (third * smoothness**1.5 * rho**3 * horizon / separation)) ** 0.4)

    def momentum(self, method: str, learning_rate: float) -> float:
        """``alpha``: for MC the sizes' floor, raised to Thm 3.4's ``alpha >~ L eta`` if
        that is larger; for PFL-TC and PDL-TC the workshop proofs' ``alpha = 3 L eta``
        (A.1, "equivalently, setting alpha = 3 L eta"); at most 1."""
        if method == "mc":
            return min(1.0, max(self.sizes.alpha, self.smoothness * learning_rate))
        return min(1.0, 3.0 * self.smoothness * learning_rate)

    def start(self, horizon: int, learning_rate: float) -> Tensor:
        """``x_0 = a u_0 + b (e_2 + ... + e_K)`` with every runner's ``<u_k, x_0> = c (h
        eta T + m)``: a runner's model drops by at most ``c eta`` a round, so its slope
        stays above ``c sigmoid(s m)`` for ``T`` rounds."""
        start = torch.zeros(self.sizes.dim, dtype=torch.float64)
        start[ANCHORED] = self.sizes.anchor
        height = self.sizes.slope * (self.sizes.headroom * learning_rate * horizon + self.sizes.margin)
        # <u_k, x_0> = (b - a) / sqrt 2
        start[1 : self.clusters] = math.sqrt(2.0) * height + self.sizes.anchor
        return start

    def federation(self, horizon: int, seed: int, learning_rate: float) -> Federation:
        """A federation started at :meth:`start`, batches of ``b``, seeded by ``seed``."""
        objective = RampObjective(self.start(horizon, learning_rate), self.sizes.sharpness)
        byzantine = torch.zeros_like(self.cluster_ids, dtype=torch.bool)
        return Federation(objective=objective, train=self.train, cluster_ids=self.cluster_ids,
                          byzantine=byzantine, seed=seed, batch_size=self.sizes.batch_size)

    def clustering_options(self, method: str, horizon: int) -> dict[str, float | int]:
        """``method``'s learning rate and ``alpha`` at ``horizon``, and Threshold-Clustering
        at Thm 3.4's radius ``sqrt(delta sqrt(alpha) rho Delta)`` and eq. (27)'s rounds
        (Alg. 4 / the workshop's Alg. 2 as printed; PDL-TC starts from each client's own
        momentum)."""
        learning_rate = self.learning_rate(method, horizon)
        alpha, rho, separation = self.momentum(method, learning_rate), self.batch_sigma, self.separation
        radius = float(bounds.clustering_radius(self.cluster_fraction, math.sqrt(alpha) * rho, separation))
        rounds = bounds.clustering_rounds(rho, separation, self.cluster_fraction, alpha=alpha)
        # Alg. 4 / the workshop's Alg. 2 as printed, their centres seeded by k-means
        # (k-means++ then Lloyd): the start the theorems assume (the runs measure it)
        printed = {**PRINTED_MC, "init": "kmeans"} if method != "pdl_tc" else {}
        # the workshop's proofs start the momenta at the gradient (alpha = 1 at t = 1)
        start = {} if method == "mc" else {"first_alpha": 1.0}
        return {"lr": learning_rate, "alpha": alpha, "radius": radius, "clustering_rounds": rounds, **printed,
                **start}


def ramp_directions(dim: int, clusters: int = 2) -> Tensor:
    """``[K, d]``: the anchored cluster's ramp ``u_0 = e_1`` and runner ``k``'s ``u_k =
    (e_{k+1} - e_1) / sqrt 2``, each opposed to ``u_0`` and the runners a unit apart
    (see the module docstring)."""
    directions = torch.zeros(clusters, dim, dtype=torch.float64)
    directions[ANCHORED, ANCHORED] = 1.0
    runners = torch.arange(1, clusters)
    directions[runners, runners] = math.sqrt(0.5)
    directions[runners, ANCHORED] = -math.sqrt(0.5)
    return directions


def separated_problem(sizes: SeparatedSizes) -> SeparatedProblem:
    """Draw the clusters' shared data sets (float64, seeded by ``task_seed``); ``sizes``
    must name its noise (:meth:`SeparatedSizes.for_method`)."""
    if sizes.noise is None:
        raise ValueError("SeparatedSizes.noise is unset: take a method's sizes with for_method(method)")
    generator = torch.Generator().manual_seed(sizes.task_seed)
    clusters = sizes.clusters
    noise = sizes.noise * torch.randn(2, sizes.samples, sizes.dim, generator=generator, dtype=torch.float64)
    noise -= noise.mean(1, keepdim=True)  # f_i has no linear part: bounded below
    # every runner holds the first runner's draws: sigma (the largest spread over the
    # clusters) does not move with K
    noise = torch.cat([noise, noise[1:].expand(clusters - 2, -1, -1)])
    directions = ramp_directions(sizes.dim, clusters)[:, None, :].expand(clusters, sizes.samples, sizes.dim)
    slopes = torch.full((clusters, sizes.samples, 1), sizes.slope, dtype=torch.float64)
    slopes[ANCHORED] = 1.0
    counts = torch.tensor([sizes.clients_per_cluster] + [sizes.clients_per_runner] * (clusters - 1))
    cluster_ids = torch.arange(clusters).repeat_interleave(counts)
    inputs = torch.cat([directions, noise, slopes], dim=-1)[cluster_ids]
    targets = torch.zeros(inputs.shape[:2], dtype=torch.float64)
    sample_sigma = math.sqrt(float(noise.square().sum(-1).mean(-1).max()))
    return SeparatedProblem(ClientData(inputs, targets), cluster_ids, sizes, sizes.sharpness / 4.0, sample_sigma)
