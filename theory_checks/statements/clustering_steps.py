"""Exact facts about one step of Threshold-Clustering (Alg. 3, eq. 24), run through
:func:`defenses.threshold_clustering` one round at a time with a fixed radius, in all
three of its evaluations (``"direct"``, ``"gram"``, ``"pairwise"``).

One step is ``v_l = v_{l-1} + (1/N) sum_{j inside} (z_j - v_{l-1})`` with "inside"
meaning ``||z_j - v_{l-1}|| <= tau``.  Each summand has norm at most ``tau``, which
gives the first two facts; the last two follow when the ball holds exactly one
cluster's points (plus, for the attacker, points the attacker places):

* one step moves the centre by at most ``(#inside / N) tau``;
* replacing ``beta N`` points moves one step's output by at most ``2 beta tau``;
* contraction: ``v_l - mean_i = (1 - delta_i) (v_{l-1} - mean_i)``;
* edge attacker (A.1, Lemma 6's "bad points at the edge of the ball"): ``beta N``
  points at ``v_{l-1} + tau u`` give ``v_l - mean_i = (1 - delta_i)(v_{l-1} - mean_i)
  + beta tau u``, whose fixed point is ``mean_i + (beta / delta_i) tau u`` (inside the
  ball iff ``beta <= delta_i``), reached geometrically at rate ``1 - delta_i``.

The evaluators are public so that tests can run property checks over them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import numpy as np
import torch
from torch import Tensor

from defenses import threshold_clustering
from theory_checks.statements import instances
from theory_checks.statements.registry import Budget, register, statement_seed
from theory_checks.statements.search import Instance, described, exact_verdict
from theory_checks.types import CheckResult

METHODS: tuple[str, ...] = ("direct", "gram", "pairwise")

# The edge attacker sits exactly on the sphere; the ball is widened by this relative
# amount so that rounding of its computed distance cannot leave it outside.  The
# identities below do not involve the ball's radius, only its membership.
EDGE_SLACK = 1e-9

# Sizes per budget: (instances per batch shape, batch shapes drawn).
_SIZES: dict[str, tuple[int, int]] = {"quick": (128, 6), "full": (512, 40)}


@dataclass(frozen=True)
class PerProblemRadius:
    """A fixed radius per problem of a batch (``taus[B]``), for batched fixed-radius
    runs; the same rule as :class:`defenses.radius.FixedRadius` (``<=``)."""

    taus: Tensor
    strict: bool = False
    undecided: ClassVar[None] = None  # reads every point (RadiusPolicy's declared default)

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return self.taus.to(distances).unsqueeze(-1).expand(distances.shape[:-1])


@contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread while the checks run: on these tiny tensors extra threads
    only add synchronisation (about 100x slower per reduction on a loaded machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _tensor(array: np.ndarray | Tensor) -> Tensor:
    if isinstance(array, Tensor):
        return array.to(torch.float64)
    return torch.tensor(np.asarray(array, dtype=np.float64))


def one_round(points: Tensor, centre: Tensor, radius: float | Tensor, method: str) -> tuple[Tensor, Tensor]:
    """One round of eq. 24 for a batch: ``points[B, N, d]``, ``centre[B, d]``, a radius
    (a number, or one per problem ``[B]``).  Returns the new centres ``[B, d]`` and the
    ball's membership ``[B, N]``."""
    spec = radius if isinstance(radius, (int, float)) else PerProblemRadius(_tensor(radius))
    result = threshold_clustering(points, centre.unsqueeze(1), spec, rounds=1, method=method)
    return result.centres[:, 0], result.inside[:, 0]


def one_step_move_sides(points: np.ndarray | Tensor, centre: np.ndarray | Tensor, radius: float | np.ndarray,
                        method: str = "direct") -> tuple[np.ndarray, np.ndarray]:
    """``(||v_1 - v_0||, (#inside / N) tau)`` per problem; the claim is ``lhs <= rhs``."""
    points, centre = _tensor(points), _tensor(centre)
    moved, inside = one_round(points, centre, radius, method)
    tau = np.broadcast_to(np.asarray(radius, float), (points.shape[0],))
    lhs = torch.linalg.vector_norm(moved - centre, dim=-1).numpy()
    rhs = inside.sum(-1).numpy() / points.shape[1] * tau
    return lhs, rhs


def replacement_sides(points: np.ndarray | Tensor, replacements: np.ndarray | Tensor, replaced: np.ndarray | Tensor,
                      centre: np.ndarray | Tensor, radius: float | np.ndarray,
                      method: str = "direct") -> tuple[np.ndarray, np.ndarray]:
    """``(||v_1 - v_1'||, 2 beta tau)`` per problem, where ``v_1'`` is one step from the
    same centre after the points marked ``replaced[B, N]`` (``beta N`` of them) are
    swapped for ``replacements``; the claim is ``lhs <= rhs``."""
    points, replacements, centre = _tensor(points), _tensor(replacements), _tensor(centre)
    mask = torch.as_tensor(np.asarray(replaced, bool) if not isinstance(replaced, Tensor) else replaced)
    swapped = torch.where(mask.unsqueeze(-1), replacements, points)
    both = torch.cat([points, swapped])
    twice = torch.cat([centre, centre])
    radii = radius if isinstance(radius, (int, float)) else np.concatenate([radius, radius])
    moved, _ = one_round(both, twice, radii, method)
    original, attacked = moved.split(points.shape[0])
    tau = np.broadcast_to(np.asarray(radius, float), (points.shape[0],))
    lhs = torch.linalg.vector_norm(original - attacked, dim=-1).numpy()
    rhs = 2.0 * mask.sum(-1).numpy() / points.shape[1] * tau
    return lhs, rhs


def contraction_residuals(honest: np.ndarray | Tensor, in_cluster: np.ndarray | Tensor, centre: np.ndarray | Tensor,
                          radius: float | np.ndarray, rounds: int = 5, method: str = "direct",
                          attackers: int = 0, direction: np.ndarray | Tensor | None = None) -> dict[str, np.ndarray]:
    """Runs ``rounds`` rounds, one at a time, with ``attackers`` points placed at
    ``v_{l-1} + tau u`` each round (``u = direction[B, d]``; none for the plain
    contraction), and compares each step with ``v_l - mean_i = (1 - delta_i)
    (v_{l-1} - mean_i) + beta tau u``.

    Returns per problem: ``step`` the largest ``||v_l - predicted||`` over rounds
    divided by ``tau``; ``membership`` whether every ball held exactly the cluster and
    the attackers; ``centres[rounds + 1, B, d]``; ``fixed_point[B, d]`` the predicted
    ``mean_i + (beta / delta_i) tau u``; ``delta`` and ``beta``.
    """
    honest, centre = _tensor(honest), _tensor(centre)
    cluster = torch.as_tensor(np.asarray(in_cluster, bool) if not isinstance(in_cluster, Tensor) else in_cluster)
    batch, n_honest, dim = honest.shape
    total = n_honest + attackers
    tau = _tensor(np.broadcast_to(np.asarray(radius, float), (batch,)))
    u = torch.zeros(batch, dim, dtype=torch.float64) if direction is None else _tensor(direction)
    weights = cluster.to(torch.float64)
    mean = (weights.unsqueeze(-1) * honest).sum(1) / weights.sum(1, keepdim=True)
    delta = weights.sum(1) / total
    beta = attackers / total
    push = beta * tau.unsqueeze(-1) * u  # beta tau u
    expected_inside = torch.cat([cluster, torch.ones(batch, attackers, dtype=torch.bool)], dim=1)
    ball = tau * (1.0 + EDGE_SLACK) if attackers else tau
    centres, worst, membership = [centre], torch.zeros(batch, dtype=torch.float64), torch.ones(batch, dtype=torch.bool)
    for _ in range(rounds):
        previous = centres[-1]
        edge = (previous + tau.unsqueeze(-1) * u).unsqueeze(1).expand(batch, attackers, dim)
        moved, inside = one_round(torch.cat([honest, edge], dim=1), previous, ball.numpy(), method)
        predicted = mean + (1.0 - delta).unsqueeze(-1) * (previous - mean) + push
        worst = torch.maximum(worst, torch.linalg.vector_norm(moved - predicted, dim=-1) / tau)
        membership &= (inside == expected_inside).all(-1)
        centres.append(moved)
    fixed_point = mean + (beta / delta).unsqueeze(-1) * tau.unsqueeze(-1) * u
    return {
        "step": worst.numpy(),
        "membership": membership.numpy(),
        "centres": torch.stack(centres).numpy(),
        "fixed_point": fixed_point.numpy(),
        "delta": delta.numpy(),
        "beta": np.full(batch, beta),
    }


def fixed_point_residuals(result: dict[str, np.ndarray], radius: float | np.ndarray) -> np.ndarray:
    """``| ||v_L - v*|| - (1 - delta)^L ||v_0 - v*|| | / tau``: the distance to the
    attacker's fixed point ``v*`` shrinks exactly by ``1 - delta`` per round."""
    centres, target, delta = result["centres"], result["fixed_point"], result["delta"]
    rounds = centres.shape[0] - 1
    start = np.linalg.norm(centres[0] - target, axis=-1)
    end = np.linalg.norm(centres[-1] - target, axis=-1)
    return np.abs(end - (1.0 - delta) ** rounds * start) / np.asarray(radius, float)


def _shapes(budget: Budget, seed: int) -> list[tuple[int, int]]:
    """``(N, d)`` per batch: small clouds, drawn once per check."""
    rng = np.random.default_rng(seed)
    _, count = _SIZES[budget]
    return [(int(rng.integers(2, 24)), int(rng.integers(1, 6))) for _ in range(count)]


Sides = Callable[[Instance, str], tuple[np.ndarray, np.ndarray]]


def _bound_check(name: str, budget: Budget, seed: int, make: Callable[..., Instance], sides: Sides) -> CheckResult:
    """Runs a ``lhs <= rhs`` step bound over every method and batch shape; margins are
    ``(rhs - lhs) / tau``."""
    size, _ = _SIZES[budget]
    rng = np.random.default_rng(seed)
    margins, ratios, runs = [], [], []
    for clients, dim in _shapes(budget, seed):
        batch = make(rng, size, clients, dim)
        for method in METHODS:
            lhs, rhs = sides(batch, method)
            margins.append((rhs - lhs) / batch["radius"])
            ratios.append(np.divide(lhs, rhs, out=np.zeros_like(lhs), where=rhs > 0))
            runs += [(batch, method, index) for index in range(size)]

    def describe(index: int) -> dict:
        batch, method, offset = runs[index]
        return {"method": method, **described(batch, lambda one: sides(one, method))(offset)}

    # lhs / rhs near 1 shows the bound is attained (the tight instances)
    return exact_verdict(name, np.concatenate(margins), describe, what="(rhs - lhs) / tau",
                         details={"methods": list(METHODS),
                                  "largest_lhs_over_rhs": float(np.concatenate(ratios).max())})


def _one_step_sides(batch: Instance, method: str) -> tuple[np.ndarray, np.ndarray]:
    return one_step_move_sides(batch["points"], batch["centre"], batch["radius"], method)


def _replacement_sides(batch: Instance, method: str) -> tuple[np.ndarray, np.ndarray]:
    return replacement_sides(batch["points"], batch["replacements"], batch["replaced"], batch["centre"],
                             batch["radius"], method)


@register(
    "one-step-move",
    "Alg. 3, eq. (24)",
    "one step of Threshold-Clustering moves a centre by at most (#inside / N) tau",
    "exact",
)
def check_one_step_move(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    with _one_thread():
        return _bound_check("one-step-move", budget, statement_seed(101, seed), instances.point_clouds, _one_step_sides)


@register(
    "replacement",
    "Alg. 3, eq. (24); A.1 (robustness to beta N bad points)",
    "replacing any beta N points moves one step's output (same centre, fixed radius) by at most 2 beta tau",
    "exact",
)
def check_replacement(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    with _one_thread():
        return _bound_check("replacement", budget, statement_seed(102, seed), instances.replacement_pairs, _replacement_sides)


def _ball_check(budget: Budget, seed: int,
                attackers_of: Callable[[np.random.Generator, int], int]) -> tuple[np.ndarray, np.ndarray, dict]:
    """Runs :func:`contraction_residuals` on clusters whose ball holds exactly them:
    per-instance step residuals, fixed-point residuals, and the membership check."""
    size, count = _SIZES[budget]
    rng = np.random.default_rng(seed)
    steps, fixed, members = [], [], []
    for _ in range(count):
        cluster, others, dim = int(rng.integers(1, 9)), int(rng.integers(0, 9)), int(rng.integers(1, 5))
        attackers = attackers_of(rng, cluster)
        batch = instances.ball_around_one_cluster(rng, size, cluster, others, attackers, dim)
        for method in METHODS:
            result = contraction_residuals(batch["honest"], batch["in_cluster"], batch["centre"], batch["radius"],
                                           rounds=30, method=method, attackers=attackers,
                                           direction=batch["direction"])
            steps.append(result["step"])
            fixed.append(fixed_point_residuals(result, batch["radius"]))
            members.append(result["membership"])
    return np.concatenate(steps), np.concatenate(fixed), {"membership_held": bool(np.concatenate(members).all())}


def _identity_verdict(name: str, steps: np.ndarray, fixed: np.ndarray, info: dict, what: str) -> CheckResult:
    if not info["membership_held"]:
        # the identities are conditional on the membership: a broken precondition is
        # a bug of the instance generator, not a counterexample
        raise RuntimeError(f"{name}: a constructed ball lost or gained a point")
    residual = np.maximum(steps, fixed)
    return exact_verdict(name, -residual, what=what, details={**info, "largest_step_residual": float(steps.max()),
                                                             "largest_fixed_point_residual": float(fixed.max())})


@register(
    "contraction",
    "A.1, Lemma 2 (ball holding exactly cluster i)",
    "if the ball holds exactly cluster i's points: v_l - mean_i = (1 - delta_i)(v_{l-1} - mean_i)",
    "exact",
)
def check_contraction(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    with _one_thread():
        steps, fixed, info = _ball_check(budget, statement_seed(103, seed), lambda rng, cluster: 0)
    return _identity_verdict("contraction", steps, fixed, info, "-(largest |identity residual| / tau)")


@register(
    "edge-attacker",
    "A.1, Lemma 6 (bad points at the edge of the ball)",
    "beta N attackers at v_{l-1} + tau u with beta <= delta_i: v_l - mean_i = (1 - delta_i)(v_{l-1} - mean_i) "
    "+ beta tau u, fixed point mean_i + (beta / delta_i) tau u, reached at rate 1 - delta_i",
    "exact",
)
def check_edge_attacker(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    with _one_thread():
        steps, fixed, info = _ball_check(budget, statement_seed(104, seed), lambda rng, cluster: int(rng.integers(1, cluster + 1)))
    return _identity_verdict("edge-attacker", steps, fixed, info, "-(largest |identity residual| / tau)")
