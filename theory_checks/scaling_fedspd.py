"""FedSPD's cluster convergence rate (``papers/fedspd.txt``, Thm 5.11) on a mixture
regression where its hypotheses can hold.

Thm 5.11: with a suitable constant learning rate ``eta``, after ``T`` rounds

    [1 + ((n - eps_N)/n) eta L] sum_t (r_t / R_T) (E F(cbar^t) - F(c*)) + mu E||cbar^(T+1) - c*||^2 <= eps

with ``T = O~( sqrt(L + mu) / (sqrt(eps) mu) (sigma + sqrt(n/N) v) + L beta n^1.5 /
(mu p sqrt(N) (n - eps_N)) ln(1/eps) + v^2 (n^2 + L^2 eps_N^2 + eps_N (S - 1)) /
(mu n^2 eps) )``.  Solved for ``eps`` (the ``ln(1/eps)`` term is lower order), with
the ``O~``'s logarithm written ``ln T``:

    eps(T) ~ ln T [ v^2 (n^2 + L^2 eps_N^2 + eps_N (S - 1)) / (mu n^2 T)
                    + (L + mu) (sigma + sqrt(n/N) v)^2 / (mu^2 T^2) ].

The instance (every choice has a reason):

* Each client holds ``m`` points, a fraction ``q_i`` uniform in ``[0.1, 0.9]`` from
  distribution A and the rest from B (the paper's MNIST split): ``a ~ N(0, I_d)``,
  ``y = a^T x_s + noise``, optima ``x_A``, ``x_B`` far apart, so every client trains
  both centres now and then and the mixing can reach consensus (Assumption 5.7).
  With one distribution per client a cluster's centre is never trained by the other
  clients, their copies stay where they started, and no ``p > 0`` holds.
* ``F_s``: the mean squared error on all of distribution ``s``'s points (pooled over
  clients), ``L`` and ``mu`` its Hessian's extreme eigenvalues (Assumption 5.1,
  ``mu > 0`` with ``m N`` points in ``d = 5``), ``F_s* > 0`` from the noise
  (Assumption 5.2).
* ``tau = 1`` local step (Thm 5.11 assumes it), the complete graph with Metropolis
  weights (doubly stochastic, as the proof's Lemma A.1 needs; the paper's uniform
  weights are only row-stochastic), ``S = 2`` centres started independently.
* Learning rate ``eta_T = min(1/(4L), 2 ln T / (mu T))`` (a constant rate for each
  horizon, as the theorem allows); weights ``r_t = (1 - mu eta / 2)^-(t+1)`` (Lemma
  A.3 adapts Koloskova et al. 2020, whose constant-step weights these are).
* ``cbar_s^t``: the mean of all ``N`` clients' copies of the centre matched to ``s``
  (Thm 5.10 averages over all ``N``); matching by the final centres' distance to the
  optima.
* Measured on the runs: ``sigma^2`` (Assumption 5.4, the largest mean squared
  per-sample gradient of a distribution at a visited ``cbar``), ``v^2`` (Assumption
  5.5, its largest variance), ``eps_N`` (the largest number of clients in a round
  whose points labelled with the centre they trained include the other
  distribution's), and ``p`` (Assumption 5.7 with ``beta = 1``: ``1 - lambda_max`` of
  ``E[W_s^T W_s]`` on the complement of the constant vector, over the selections the
  run's mixture weights give, by Monte Carlo).

Beside ``T`` the full budget sweeps the instance (:data:`SWEPT_SIZES`: the clients,
the label noise, the optima's scale and the dimension) at one horizon, each judged by
its error / bound ratio, and reports the constant's spread across those instances.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Mapping

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

import defenses
from defenses.fedspd import cluster_weights
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.graphs import Graph
from robust_pfl.engine.objectives import linear_regression
from robust_pfl.engine.rounds import run_rounds
from robust_pfl.engine.types import RoundRecord
from theory_checks.controls import rate_control
from theory_checks.least_squares import least_squares
from theory_checks.scaling_common import Budget, ConstantSweep, Formula, ScalingStudy, Sweep, assemble, evaluate
from theory_checks.types import Hypothesis

SOURCES = 2


@dataclass(frozen=True)
class FedSPDSizes:
    """The mixture regression and the sweep."""

    clients: int = 16
    dim: int = 5
    samples: int = 40
    batch_size: int = 4
    noise: float = 0.1
    optimum_scale: float = 3.0
    horizons: tuple[int, ...] = (32, 64, 128, 256)
    repeats: int = 4
    consensus_draws: int = 2000
    task_seed: int = 0
    sweep_horizon: int | None = None
    sweep_repeats: int = 8


#: The quick budget sweeps ``T`` only: it already runs at eight seeds
#: (``other_papers.QUICK_STABILITY_SEEDS``) and reads "inconclusive at this budget";
#: the full budget also sweeps the instance (:data:`SWEPT_SIZES`) at ``T = 128``, with
#: as many repeats as its ``T`` sweep (a run's error is heavy-tailed across seeds).
FEDSPD_BUDGETS: dict[str, FedSPDSizes] = {
    "quick": FedSPDSizes(),
    "full": FedSPDSizes(horizons=(32, 64, 128, 256, 512, 1024), repeats=24, sweep_horizon=128, sweep_repeats=24),
}


@dataclass(frozen=True)
class MixtureProblem:
    """The clients' data, every point's source, and each source's pooled risk: Hessian
    ``H_s``, minimiser ``c_s*``, optimum ``F_s*``."""

    train: ClientData
    sources: Tensor  # [N, m]
    hessians: Tensor  # [S, d, d]
    optima: Tensor  # [S, d]
    optimal_values: Tensor  # [S]

    @property
    def smoothness(self) -> float:
        return float(torch.linalg.eigvalsh(self.hessians)[:, -1].max())

    @property
    def strong_convexity(self) -> float:
        return float(torch.linalg.eigvalsh(self.hessians)[:, 0].min())

    def risks(self, centres: Tensor) -> Tensor:
        """``F_s(centres[s]) - F_s*`` for ``centres[S, d]`` (exact: quadratics)."""
        gaps = centres - self.optima
        return 0.5 * torch.einsum("sd,sde,se->s", gaps, self.hessians, gaps)

    def gradient_moments(self, centres: Tensor) -> tuple[float, float]:
        """The largest over sources of the mean squared per-sample gradient and of its
        variance at ``centres[s]`` (Assumptions 5.4 and 5.5)."""
        second, variance = 0.0, 0.0
        for s in range(SOURCES):
            mask = self.sources == s
            a, y = self.train.inputs[mask], self.train.targets[mask]  # [P, d], [P]
            per_sample = a * (a @ centres[s] - y).unsqueeze(-1)
            second = max(second, float(per_sample.square().sum(-1).mean()))
            variance = max(variance, float((per_sample - per_sample.mean(0)).square().sum(-1).mean()))
        return second, variance


def mixture_problem(sizes: FedSPDSizes) -> MixtureProblem:
    generator = torch.Generator().manual_seed(sizes.task_seed)
    optima = sizes.optimum_scale * torch.randn(SOURCES, sizes.dim, generator=generator, dtype=torch.float64)
    fractions = 0.1 + 0.8 * torch.rand(sizes.clients, 1, generator=generator, dtype=torch.float64)
    position = torch.arange(sizes.samples, dtype=torch.float64) / sizes.samples
    sources = (position.unsqueeze(0) >= fractions).long()  # the first q_i m points from A
    inputs = torch.randn(sizes.clients, sizes.samples, sizes.dim, generator=generator, dtype=torch.float64)
    noise = sizes.noise * torch.randn(sizes.clients, sizes.samples, generator=generator, dtype=torch.float64)
    targets = torch.einsum("nmd,nmd->nm", inputs, optima[sources]) + noise
    hessians, minimisers, values = [], [], []
    for s in range(SOURCES):
        a, y = inputs[sources == s], targets[sources == s]
        hessians.append(a.T @ a / a.shape[0])
        x = least_squares(a, y)
        minimisers.append(x)
        values.append(0.5 * (a @ x - y).square().mean())
    return MixtureProblem(ClientData(inputs, targets), sources, torch.stack(hessians), torch.stack(minimisers),
                          torch.stack(values))


def learning_rate(problem: MixtureProblem, horizon: int) -> float:
    """``eta_T = min(1/(4L), 2 ln T / (mu T))``."""
    return min(1.0 / (4 * problem.smoothness), 2 * math.log(horizon) / (problem.strong_convexity * horizon))


@dataclass(frozen=True)
class FedSPDRun:
    """One run: the left side of eq. (9) per source, and what the hypotheses need."""

    error: float
    sigma2: float
    v2: float
    wrong_clients: int
    mixture: Tensor  # [N, S]: mean mixture weights over the rounds, matched to the sources
    frozen_error: float  # the left side for centres that never leave their start (the control)
    found: bool = True  # every matched final centre within half the optima's distance of its optimum


def _run(problem: MixtureProblem, sizes: FedSPDSizes, horizon: int, seed: int) -> FedSPDRun:
    eta = learning_rate(problem, horizon)
    federation = Federation(objective=linear_regression(sizes.dim), train=problem.train,
                            cluster_ids=problem.sources.mode(dim=1).values,
                            byzantine=torch.zeros(sizes.clients, dtype=torch.bool), seed=seed,
                            batch_size=sizes.batch_size)
    options = {"lr": eta, "centres": SOURCES, "local_steps": 1, "double_first_round": False,
               "centre_init": "independent", "graph": {"kind": "complete", "weights": "metropolis"},
               "finetune_steps": 0}
    algorithm = defenses.build("fedspd", federation, options)
    means = [algorithm.centres.mean(dim=1).clone()]  # cbar^t, [S, d] per round, unmatched
    mixture = torch.zeros(sizes.clients, SOURCES, dtype=torch.float64)
    wrong = 0

    def after(done: int, record: RoundRecord) -> None:
        nonlocal mixture, wrong
        means.append(algorithm.centres.mean(dim=1).clone())
        mixture += record.extras["mixture_weights"] / horizon
        labelled = algorithm.labels == record.extras["selected"].unsqueeze(-1)  # points of the trained centre
        wrong = max(wrong, int((labelled.unsqueeze(-1) & _mismatch(problem, algorithm)).any(dim=(1, 2)).sum()))

    run_rounds(algorithm, horizon, after=after)
    order = _matching(problem, means[-1])
    trajectory = torch.stack(means)[:, order]  # [T + 1, S, d], centre s matched to source s
    risks = torch.stack([problem.risks(centres) for centres in trajectory[:-1]])  # [T, S]
    strong = problem.strong_convexity
    weights = (1 - strong * eta / 2) ** -(torch.arange(horizon, dtype=torch.float64) + 1)
    factor = 1 + eta * problem.smoothness  # (n - eps_N)/n <= 1: the factor at its largest
    average = (weights.unsqueeze(-1) * risks).sum(0) / weights.sum()
    final = strong * (trajectory[-1] - problem.optima).square().sum(-1)
    moments = [problem.gradient_moments(centres) for centres in trajectory]
    # a model that never moves: every weighted risk and the last distance at the start
    frozen = factor * risks[0] + strong * (trajectory[0] - problem.optima).square().sum(-1)
    reach = 0.5 * float(torch.pdist(problem.optima).min())
    found = bool((trajectory[-1] - problem.optima).norm(dim=-1).max() < reach)
    return FedSPDRun(float((factor * average + final).max()), max(m[0] for m in moments), max(m[1] for m in moments),
                     wrong, mixture[:, order], float(frozen.max()), found)


def _matching(problem: MixtureProblem, centres: Tensor) -> Tensor:
    """The centre index matched to every source (least total squared distance)."""
    cost = torch.cdist(problem.optima, centres).square().numpy()
    rows, cols = linear_sum_assignment(cost)
    return torch.as_tensor(cols[np.argsort(rows)])


def _mismatch(problem: MixtureProblem, algorithm: Any) -> Tensor:
    """``[N, m, 1]``: a point labelled with a centre other than the one nearest its
    source's optimum (a point on the wrong data)."""
    nearest = torch.cdist(problem.optima, algorithm.centres.mean(dim=1)).argmin(dim=1)  # source -> centre
    return (algorithm.labels != nearest[problem.sources]).unsqueeze(-1)


def consensus_rate(mixture: Tensor, draws: int, generator: torch.Generator) -> float:
    """Assumption 5.7 with ``beta = 1`` on the complete graph with Metropolis weights:
    ``p = 1 - lambda_max(E[W_s^T W_s])`` on the complement of the constant vector, the
    worst cluster, each client training ``s`` with probability ``mixture[i, s]``."""
    clients = mixture.shape[0]
    graph = Graph(~torch.eye(clients, dtype=torch.bool))
    mixing = graph.mixing_weights("metropolis", dtype=torch.float64)
    receivers = torch.arange(clients)
    second = torch.zeros(SOURCES, clients, clients, dtype=torch.float64)
    for _ in range(draws):
        selected = torch.multinomial(mixture, 1, generator=generator).squeeze(-1)
        w = cluster_weights(mixing, selected, receivers, SOURCES, "metropolis")  # [S, N, N]
        second += w.transpose(1, 2) @ w / draws
    projector = torch.eye(clients, dtype=torch.float64) - 1.0 / clients
    worst = max(float(torch.linalg.eigvalsh(projector @ second[s] @ projector)[-1]) for s in range(SOURCES))
    return 1.0 - worst


#: The clustering controls: FedSPD's centres where training on a partition of the
#: points that ignores their source settles, each centre at the least-squares fit of
#: its group (matched to the sources like the runs' centres), held at every ``T``.
PARTITION_CONTROLS = {
    "none": "no clustering (both centres at the least-squares fit of every point: the best single model)",
    "wrong": "a wrong fixed partition (each centre fitted to every other point of every client: half of each source)",
    "random": "a random assignment (each centre fitted to a random half of the points, drawn afresh per repeat)",
}
#: The random partition's stream (independent of the runs' federation seeds).
PARTITION_STREAM = 4099


def partition_centres(problem: MixtureProblem, members: Tensor) -> Tensor:
    """``[S, d]``: centre ``k`` the least-squares fit of its points ``members[k]``
    (``[S, N, m]`` bool), matched to the sources (:func:`_matching`)."""
    a, y = problem.train.inputs, problem.train.targets
    fits = torch.stack([least_squares(a[mask], y[mask]) for mask in members])
    return fits[_matching(problem, fits)]


def held_error(problem: MixtureProblem, centres: Tensor, horizon: int) -> float:
    """The left side of eq. (9) for centres held at ``centres[S, d]`` (matched) over
    ``horizon`` rounds: every weighted risk and the last distance at them."""
    factor = 1 + learning_rate(problem, horizon) * problem.smoothness
    distance = problem.strong_convexity * (centres - problem.optima).square().sum(-1)
    return float((factor * problem.risks(centres) + distance).max())


def partition_errors(problem: MixtureProblem, sizes: FedSPDSizes, seed: int, repeats: int) -> dict[str, np.ndarray]:
    """Each clustering control's error ``[len(horizons), repeats]`` (the random one
    drawn per repeat; the others the same at every repeat)."""
    clients, samples = problem.sources.shape
    every = torch.ones(SOURCES, clients, samples, dtype=torch.bool)
    even = (torch.arange(samples) % 2 == 0).expand(clients, -1)
    generator = torch.Generator().manual_seed(PARTITION_STREAM + seed)
    halves = [torch.rand(clients, samples, generator=generator) < 0.5 for _ in range(repeats)]
    members = {"none": [every] * repeats, "wrong": [torch.stack([even, ~even])] * repeats,
               "random": [torch.stack([half, ~half]) for half in halves]}
    return {name: np.array([[held_error(problem, partition_centres(problem, m), h) for m in members[name]]
                            for h in sizes.horizons]) for name in PARTITION_CONTROLS}


Reading = Literal["printed", "text"]
#: eq. (9) solved for ``eps`` keeps both terms (``ln T / T`` is the slowest); the text
#: after it says ``O(1/sqrt(eps))`` rounds, ``eps ~ 1/T^2``: its ``T^-2`` term alone.
READINGS: tuple[Reading, ...] = ("printed", "text")
FROZEN = "frozen centres (cbar stays at its start)"


@dataclass(frozen=True)
class FedSPDMeasurements:
    """The runs of every horizon (``runs[horizon][repeat]``) and what the hypotheses
    read from them."""

    runs: tuple[tuple[FedSPDRun, ...], ...]
    sigma2: float
    v2: float
    wrong: int
    consensus: float


@functools.lru_cache(maxsize=16)
def _measure(sizes: FedSPDSizes, seed: int) -> FedSPDMeasurements:
    """Every run of the sweep (shared by both readings: one set of runs per seed)."""
    problem = mixture_problem(sizes)
    runs = tuple(tuple(_run(problem, sizes, horizon, seed * 1000 + repeat) for repeat in range(sizes.repeats))
                 for horizon in sizes.horizons)
    every = [run for row in runs for run in row]
    mixture = torch.stack([run.mixture for run in every]).mean(0).clamp_min(1e-12)
    p = consensus_rate(mixture, sizes.consensus_draws, torch.Generator().manual_seed(seed))
    return FedSPDMeasurements(runs, max(run.sigma2 for run in every), max(run.v2 for run in every),
                              max(run.wrong_clients for run in every), p)


def collapsed_repeats(measured: FedSPDMeasurements, sizes: FedSPDSizes, seed: int) -> list[dict[str, Any]]:
    """The repeats whose run at some horizon never converged: a final centre ended
    farther than half the optima's distance from the optimum it is matched to (the
    centres settled at a spurious configuration, each a blend of both sources, and the
    error stays near the start's).  Such a repeat (one federation seed, run at every
    horizon) is named and dropped from every horizon, which keeps the other repeats
    paired across horizons; the statement is then judged on the runs whose centres
    found the sources."""
    found = []
    for repeat in range(sizes.repeats):
        horizons = [h for h, row in zip(sizes.horizons, measured.runs) if not row[repeat].found]
        if horizons:
            found.append({"repeat": repeat, "federation_seed": seed * 1000 + repeat, "horizons": horizons})
    return found


def fedspd_rate_study(budget: Budget = "quick", sizes: FedSPDSizes | None = None, seed: int = 0,
                      reading: Reading = "printed") -> ScalingStudy:
    """FedSPD on the mixture regression at every horizon of the budget (repeat ``r``:
    federation seed ``1000 seed + r``), against eq. (9) solved for ``eps`` under
    ``reading``: ``"printed"`` (both terms; the claimed exponent is the slope of the
    slowest, ``ln T / T``, over the sweep) or ``"text"`` (the ``O(1/sqrt(eps))``
    rounds the text states: ``ln T / T^2``).  The negative control is frozen centres.
    Repeats whose centres never found the sources are dropped and named
    (:func:`collapsed_repeats`)."""
    if reading not in READINGS:
        raise ValueError(f"reading must be one of {READINGS}, got {reading!r}")
    chosen = sizes or FEDSPD_BUDGETS[budget]
    problem = mixture_problem(chosen)
    measured = _measure(chosen, seed)
    collapsed = collapsed_repeats(measured, chosen, seed)
    kept = [r for r in range(chosen.repeats) if r not in {entry["repeat"] for entry in collapsed}]
    if len(kept) < 2:  # too few runs left to fit: keep them all, and say so
        kept = list(range(chosen.repeats))
    errors = np.array([[row[r].error for r in kept] for row in measured.runs])
    frozen = np.array([[row[r].frozen_error for r in kept] for row in measured.runs])
    horizons = np.array(chosen.horizons, dtype=float)
    sigma2, v2, wrong, p = measured.sigma2, measured.v2, measured.wrong, measured.consensus
    smooth, strong = problem.smoothness, problem.strong_convexity
    formula = FORMULAS[reading]
    rhs = evaluate(formula, [_arguments(chosen, problem, measured, h) for h in chosen.horizons])
    slowest = np.log(horizons) / horizons ** (1 if reading == "printed" else 2)
    claimed = float(np.polyfit(np.log(horizons), np.log(slowest), 1)[0])
    sweep = Sweep("T", tuple(float(h) for h in horizons), errors, tuple(float(r) for r in rhs), claimed)
    control = rate_control(FROZEN, horizons, frozen, rhs, claimed, seed=seed)
    controls = tuple(rate_control(PARTITION_CONTROLS[name], horizons, held, rhs, claimed, seed=seed)
                     for name, held in partition_errors(problem, chosen, seed, len(kept)).items())
    settings = {**asdict(chosen), "L": smooth, "mu": strong, "sigma2": sigma2, "v2": v2, "eps_N": wrong, "p": p,
                "reading": reading, "learning_rates": [learning_rate(problem, h) for h in chosen.horizons],
                "seed": seed}
    findings = {"bound_slope_over_sweep": float(np.polyfit(np.log(horizons), np.log(rhs), 1)[0]),
                "collapsed_repeats": collapsed, "repeats_used": len(kept)}
    theorem = "fedspd-thm5.11" if reading == "printed" else "fedspd-thm5.11-text"
    sweeps = ()
    if chosen.sweep_horizon is not None:
        sweeps = tuple(_size_sweep(name, chosen, seed, formula) for name in SWEPT_SIZES)
        findings["sweep_repeats_used"] = {sweep.variable: int(sweep.errors.shape[1]) for sweep in sweeps}
    return assemble(theorem, [sweep], settings, seed, findings, _hypotheses(problem, measured), control, controls,
                    constant_sweeps=sweeps)


def _hypotheses(problem: MixtureProblem, measured: FedSPDMeasurements) -> tuple[Hypothesis, ...]:
    """Thm 5.11's hypotheses on one instance's runs."""
    strong, smooth, p = problem.strong_convexity, problem.smoothness, measured.consensus
    return (
        Hypothesis("Assumption 5.1", "mu > 0 (each source's pooled risk strongly convex)", strong, 0.0, strong > 0,
                   f"L = {smooth:.3g}"),
        Hypothesis("Assumption 5.2", "F_inf = min_s F_s* > 0", float(problem.optimal_values.min()), 0.0,
                   bool(problem.optimal_values.min() > 0), "the sources' optima"),
        Hypothesis("Assumptions 5.4-5.5 on the runs", "sigma^2, v^2: the largest values at a visited cbar (the bound "
                   "uses them)", measured.v2, measured.v2, True, f"sigma^2 = {measured.sigma2:.3g}"),
        Hypothesis("Assumption 5.7", "consensus rate p > 0 (beta = 1, Metropolis weights, the run's selection "
                   "probabilities)", p, 0.0, p > 0, "the worst cluster"),
    )


def printed_formula(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """Eq. (9) solved for ``eps``, constant 1: ``ln T [v^2 (n^2 + L^2 eps_N^2 + eps_N (S -
    1)) / (mu n^2 T) + (L + mu)(sigma + sqrt(n/N) v)^2 / (mu^2 T^2)]``."""
    return np.log(c["T"]) * (_noise_term(c) + _start_term(c))


def text_formula(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """The text's ``O(1/sqrt(eps))`` rounds: ``ln T (L + mu)(sigma + sqrt(n/N) v)^2 / (mu^2 T^2)``."""
    return np.log(c["T"]) * _start_term(c)


def _noise_term(c: Mapping[str, np.ndarray]) -> np.ndarray:
    n = c["n"]
    return c["v2"] * (n**2 + c["L"] ** 2 * c["eps_N"] ** 2 + c["eps_N"] * (c["S"] - 1)) / (c["mu"] * n**2 * c["T"])


def _start_term(c: Mapping[str, np.ndarray]) -> np.ndarray:
    spread = (np.sqrt(c["sigma2"]) + np.sqrt(c["n"] / c["N"] * c["v2"])) ** 2
    return (c["L"] + c["mu"]) * spread / (c["mu"] ** 2 * c["T"] ** 2)


FORMULAS: dict[Reading, Formula] = {"printed": printed_formula, "text": text_formula}


def _arguments(sizes: FedSPDSizes, problem: MixtureProblem, measured: FedSPDMeasurements,
               horizon: int) -> dict[str, float]:
    """The bound's arguments on one instance at ``horizon`` (``n = N / S``, the clients
    per source), with the swept sizes."""
    return {"T": float(horizon), "v2": measured.v2, "sigma2": measured.sigma2, "n": sizes.clients / SOURCES,
            "N": float(sizes.clients), "L": problem.smoothness, "mu": problem.strong_convexity,
            "eps_N": float(measured.wrong), "S": float(SOURCES), "clients": float(sizes.clients),
            "noise": sizes.noise, "optimum_scale": sizes.optimum_scale, "dim": float(sizes.dim)}


#: The sizes swept beside ``T`` at the full budget, one at a time at ``sweep_horizon``
#: (``sweep_repeats`` runs each): the clients ``N`` (``n = N / 2`` per source), the
#: label noise (moves ``F*``, ``sigma`` and ``v``), the optima's scale (moves ``sigma``,
#: ``v`` and the start's distance) and the dimension (moves ``L`` and ``mu``).  Each
#: moves several of the bound's arguments at once, so each is judged by its error /
#: bound ratio, which one hidden constant needs flat
#: (:class:`~theory_checks.scaling_common.ConstantSweep`, ``covarying``).
SWEPT_SIZES: dict[str, tuple[float, ...]] = {
    "clients": (8, 16, 32),
    "noise": (0.05, 0.1, 0.2),
    "optimum_scale": (1.5, 3.0, 6.0),
    "dim": (4, 5, 8),
}
_INTEGER_SIZES = frozenset({"clients", "dim"})


def _size_sweep(name: str, sizes: FedSPDSizes, seed: int, formula: Formula) -> ConstantSweep:
    """One size of :data:`SWEPT_SIZES` at ``sizes.sweep_horizon``: each value's runs
    (repeats whose centres never found the sources dropped, as for ``T``; every value
    then keeps as many repeats as the one that kept fewest) and hypotheses measured on
    its own runs."""
    horizon = int(sizes.sweep_horizon)
    errors, arguments, admissible = [], [], []
    for value in SWEPT_SIZES[name]:
        instance = replace(sizes, horizons=(horizon,), repeats=sizes.sweep_repeats, sweep_horizon=None,
                           **{name: int(value) if name in _INTEGER_SIZES else float(value)})
        problem = mixture_problem(instance)
        measured = _measure(instance, seed)
        dropped = {entry["repeat"] for entry in collapsed_repeats(measured, instance, seed)}
        errors.append([run.error for r, run in enumerate(measured.runs[0]) if r not in dropped])
        arguments.append(_arguments(instance, problem, measured, horizon))
        admissible.append(all(h.holds for h in _hypotheses(problem, measured)))
    kept = min(len(row) for row in errors)
    table = np.array([row[:kept] for row in errors])
    return ConstantSweep.of(name, name, SWEPT_SIZES[name], table, arguments, admissible, formula, covarying=True)
