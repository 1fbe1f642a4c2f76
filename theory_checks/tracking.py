"""Estimates of Werner et al.'s constants recorded along any run (the ``[theory]``
table of a run config).

At every ``every``-th round the tracker draws ``clients`` honest clients afresh (a
stream seeded by the run's seed and the round, so the rows are the same on every
machine and after a resume) and evaluates, with the task's oracle clusters:

* ``theory_A2``: Assumption 4's A^2, the largest ratio of eq. (31) over every honest
  client at the drawn clients' distinct models (Assumption 4 holds "for all x");
* ``theory_Delta2``: Assumption 5's Delta^2 with D = 0, the smallest value of eq. (32)
  over cross-cluster pairs of honest clients at those models;
* ``theory_sigma2``: Assumption 6's sigma^2 from per-sample gradients at each drawn
  client's own model (and ``theory_sigma2_batch``, Lemma 7's value for the run's batch
  size drawn without replacement);
* ``theory_L`` / ``theory_mu``: the extreme Hessian eigenvalues of the drawn clients'
  local losses at their models (``lanczos_steps`` Lanczos steps on Hessian-vector
  products);
* ``theory_momentum_Delta2`` / ``theory_momentum_sigma2``: Assumptions 8-9 on the
  momenta a method sends (Momentum-Clustering), when its round record carries them.

Only honest clients' data and models enter, so an attack's rows (NaN, Inf, 1e38) can
never reach an estimate; full local data gives the true gradients grad f_i.

Each is the max (or min) over the drawn clients, so it bounds the constant over all
clients from one side; drawing all of them (``clients = None``) gives the full
estimate.  The cost of a measurement, per drawn client or model: A and Delta, the
gradients of every honest client at each drawn model on its full data; sigma, one
gradient per sample; L and mu, ``lanczos_steps`` Hessian-vector products on the full
local data (``benchmarks/bench_theory.py`` measures the overhead on the quick start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from robust_pfl.engine.data import Batch
from robust_pfl.engine.seeding import generator, stream_seed
from robust_pfl.engine.tasks import Task
from robust_pfl.engine.types import RoundRecord
from theory_checks.estimators import (
    batch_noise,
    full_gradients,
    gradient_noise,
    intra_cluster_ratio,
    momentum_constants,
    separation,
    smoothness,
    strong_convexity,
)
from theory_checks.types import Estimate


#: The default bound on the cross gradients held at once on the CPU (on CUDA the
#: default is a share of the free memory: :func:`robust_pfl.engine.devices.memory_budget_mb`).
CPU_BUDGET_MB = 256


@dataclass
class TheoryTracker:
    """Measures the constants named in ``estimate`` for one run (see module docstring).

    Attributes:
        task: the run's task (on the run's device); its ``train`` split gives the
            full local losses, its ``cluster_ids`` the oracle clusters.
        estimate: names from ``A, Delta, sigma, L, mu, momentum``.
        every: rounds between measurements.
        batch_size: the run's batch size (``None``: full local data).
        clients: honest clients drawn per measurement (``None``: all of them).
        lanczos_steps: Lanczos steps for ``L`` and ``mu``.
        budget: the largest share of the run's per-sample gradient evaluations the
            measurements may add (:meth:`due`); ``inf``: no limit.
        seed: the run's seed (the draws' stream).
        memory_budget_mb: bound on the cross gradients held at once.
    """

    task: Task
    estimate: Sequence[str]
    every: int = 10
    batch_size: int | None = None
    clients: int | None = 8
    lanczos_steps: int = 12
    budget: float = math.inf
    seed: int = 0
    memory_budget_mb: int = CPU_BUDGET_MB

    def __post_init__(self) -> None:
        self._honest = (~self.task.byzantine).nonzero().squeeze(-1)
        if self._honest.numel() == 0:
            raise ValueError("theory estimates need at least one honest client")
        self._data = self.task.train.select(self._honest)
        self._clusters = self.task.cluster_ids[self._honest]

    def due(self, done: int, total: int, trained: int = 0, measured: int = 0) -> bool:
        """Whether to measure after ``done`` of ``total`` rounds: always at round 0 and
        after the last; at every ``every``-th round while ``measured + 1``
        measurements cost at most ``budget`` times the ``trained`` per-sample gradient
        evaluations of the run so far (:meth:`cost`).  Counts, not seconds, decide, so
        every machine records the same rounds."""
        if done in (0, total):
            return True
        if done % self.every:
            return False
        return math.isinf(self.budget) or (measured + 1) * self.cost() <= self.budget * trained

    def cost(self) -> int:
        """One measurement's work in per-sample gradient evaluations: for A and Delta,
        every honest client's full local gradient at each drawn client's model; for
        sigma, one per sample of each drawn client; for L and for mu, ``lanczos_steps``
        Hessian-vector products on each drawn client's data, at three gradients'
        cost each.  The momentum estimates read the records only."""
        honest, samples = self._honest.numel(), self._data.inputs.shape[1]
        drawn = honest if self.clients is None else min(self.clients, honest)
        wanted = set(self.estimate)
        total = drawn * honest * samples if wanted & {"A", "Delta"} else 0
        total += drawn * samples if "sigma" in wanted else 0
        total += len(wanted & {"L", "mu"}) * 3 * self.lanczos_steps * drawn * samples
        return total

    def drawn(self, round_index: int) -> Tensor:
        """The honest clients (positions among them, sorted) measured after
        ``round_index`` rounds."""
        count = self._honest.numel()
        if self.clients is None or self.clients >= count:
            return torch.arange(count, device=self._honest.device)
        stream = generator(self.seed, f"theory-clients-{round_index}")
        return torch.randperm(count, generator=stream)[: self.clients].sort().values.to(self._honest.device)

    def measure(self, models: Tensor, record: RoundRecord | None = None, train: Batch | None = None,
                round_index: int = 0) -> dict[str, float]:
        """``{metric: value}`` at the clients' ``models[N, d]`` (honest rows are read)
        after ``round_index`` rounds; ``train`` replaces the task's training data when
        the run re-deals it."""
        wanted = set(self.estimate)
        own = models[self._honest]
        data = self._data if train is None else train.select(self._honest)
        chosen = self.drawn(round_index)
        out: dict[str, float] = {}
        if wanted & {"A", "Delta"}:
            ratio, gap = self._gradient_constants(own[chosen], data, "A" in wanted, "Delta" in wanted)
            if ratio is not None:
                out["theory_A2"] = ratio.value
            if gap is not None:
                out["theory_Delta2"] = gap.value
        objective = self.task.objective
        if "sigma" in wanted:
            noise = gradient_noise(objective, own[chosen], data.select(chosen))
            out["theory_sigma2"] = noise.value
            samples = data.inputs.shape[1]
            if self.batch_size is not None and self.batch_size < samples:
                out["theory_sigma2_batch"] = float(batch_noise(noise.value, self.batch_size, samples))
        mask = torch.zeros(own.shape[0], dtype=torch.bool, device=own.device)
        mask[chosen] = True
        curvature = {"iterations": self.lanczos_steps, "method": "lanczos", "include": mask,
                     "seed": stream_seed(self.seed, f"theory-curvature-{round_index}")}
        if "L" in wanted:
            out["theory_L"] = smoothness(objective, own, data, **curvature).value
        if "mu" in wanted:
            out["theory_mu"] = strong_convexity(objective, own, data, **curvature).value
        if "momentum" in wanted and record is not None and record.momenta is not None:
            constants = momentum_constants(record.momenta[self._honest], self._clusters)
            out["theory_momentum_Delta2"] = constants["Delta2"].value
            out["theory_momentum_sigma2"] = constants["sigma2"].value
        return out

    def _gradient_constants(
        self, own: Tensor, data: Batch, ratio: bool, gap: bool
    ) -> tuple[Estimate | None, Estimate | None]:
        """A^2 and Delta^2 at the distinct models among ``own`` (the drawn clients'),
        with every honest client's gradient there, in chunks of models whose cross
        gradients ``[m, H, d]`` fit the memory budget (each chunk evaluated by
        :func:`full_gradients`, which also bounds the samples per call)."""
        points = torch.unique(own, dim=0)  # clients sharing a model (GT, IFCA) count once
        per_model = own.shape[0] * own.shape[1] * own.element_size() * 3  # gradients + temporaries
        chunk = max(1, (self.memory_budget_mb << 20) // max(per_model, 1))
        best_ratio = best_gap = None
        for part in torch.split(points, chunk):
            gradients = full_gradients(self.task.objective, part, data)
            if ratio:
                found = intra_cluster_ratio(gradients, self._clusters)
                best_ratio = found if best_ratio is None else best_ratio.combined(found)
            if gap:
                found = separation(gradients, self._clusters)
                best_gap = found if best_gap is None else best_gap.combined(found)
        return best_ratio, best_gap
