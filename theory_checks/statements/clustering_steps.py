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
from theory_checks.controls import margin_control
from theory_checks.statements import instances
from theory_checks.statements.registry import Budget, register, statement_seed
from theory_checks.statements.search import TOLERANCE, Instance, described, exact_verdict
from theory_checks.types import CheckResult, NegativeControl

METHODS: tuple[str, ...] = ("direct", "gram", "pairwise")

# The edge attacker sits exactly on the sphere; the ball is widened by this relative
# amount so that rounding of its computed distance cannot leave it outside.  The
# identities below do not involve the ball's radius, only its membership.
EDGE_SLACK = 1e-9

# Sizes per budget: (instances per batch shape, batch shapes drawn).
_SIZES: dict[str, tuple[int, int]] = {"quick": (128, 6), "full": (512, 40)}

#: The broken step of the step bounds' controls: a radius no point exceeds, i.e.
#: Threshold-Clustering without its threshold (every point pulls the centre: the mean).
NO_THRESHOLD = float("inf")

# The controls: instances per shape, and the shapes ((N, d) for the step bounds;
# (cluster, others, d) for the contraction, (cluster, attackers, d) for the attacker).
_CONTROL_SIZE = 96
_CONTROL_CLOUDS: tuple[tuple[int, int], ...] = ((3, 1), (8, 2), (17, 4))
_CONTROL_BALLS: tuple[tuple[int, int, int], ...] = ((1, 0, 1), (4, 3, 2), (8, 8, 4))
_CONTROL_ATTACKS: tuple[tuple[int, int, int], ...] = ((1, 2, 1), (3, 4, 2), (8, 9, 4))

# Rounds of the contraction and edge-attacker runs (real and control).
ROUNDS = 30


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
    return _move_against_bound(points, centre, radius, method, thresholded=True)


def unthresholded_move_sides(points: np.ndarray | Tensor, centre: np.ndarray | Tensor, radius: float | np.ndarray,
                             method: str = "direct") -> tuple[np.ndarray, np.ndarray]:
    """The one-step bound's negative control (a broken algorithm): ``(||v_1 - v_0||,
    (#inside / N) tau)`` with ``v_1`` from eq. (24) *without its threshold* (every
    point pulls the centre, so ``v_1`` is the mean of all points) and ``#inside``
    still counted in the ``tau``-ball.  The bound rests on each summand ``z_j - v_0``
    having norm ``<= tau``; a point outside the ball breaks it
    (:func:`instances.one_sided_clouds` makes the bound necessarily fail)."""
    return _move_against_bound(points, centre, radius, method, thresholded=False)


def _move_against_bound(points: np.ndarray | Tensor, centre: np.ndarray | Tensor, radius: float | np.ndarray,
                        method: str, thresholded: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(||v_1 - v_0||, (#inside / N) tau)``, the step run with the ``tau``-ball or,
    unless ``thresholded``, with none (the bound's ``#inside`` always counts the ball)."""
    points, centre = _tensor(points), _tensor(centre)
    moved, inside = one_round(points, centre, radius, method)
    if not thresholded:
        moved, _ = one_round(points, centre, NO_THRESHOLD, method)
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
    return _replacement_gap(points, replacements, replaced, centre, radius, method, thresholded=True)


def unthresholded_replacement_sides(points: np.ndarray | Tensor, replacements: np.ndarray | Tensor,
                                    replaced: np.ndarray | Tensor, centre: np.ndarray | Tensor,
                                    radius: float | np.ndarray,
                                    method: str = "direct") -> tuple[np.ndarray, np.ndarray]:
    """The replacement bound's negative control (a broken algorithm, A.1's robustness
    to ``beta N`` bad points without the threshold that gives it): ``(||v_1 - v_1'||,
    2 beta tau)`` with both steps run *without their threshold* (the mean, on which
    ``beta N`` replaced points have unbounded influence;
    :func:`instances.pushed_replacements` makes the bound necessarily fail)."""
    return _replacement_gap(points, replacements, replaced, centre, radius, method, thresholded=False)


def _replacement_gap(points: np.ndarray | Tensor, replacements: np.ndarray | Tensor, replaced: np.ndarray | Tensor,
                     centre: np.ndarray | Tensor, radius: float | np.ndarray, method: str,
                     thresholded: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(||v_1 - v_1'||, 2 beta tau)``, both steps run with the ``tau``-ball or, unless
    ``thresholded``, with none."""
    points, replacements, centre = _tensor(points), _tensor(replacements), _tensor(centre)
    mask = torch.as_tensor(np.asarray(replaced, bool) if not isinstance(replaced, Tensor) else replaced)
    swapped = torch.where(mask.unsqueeze(-1), replacements, points)
    both = torch.cat([points, swapped])
    twice = torch.cat([centre, centre])
    if not thresholded:
        radii: float | np.ndarray = NO_THRESHOLD
    else:
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

#: What the step bounds' margins measure.
STEP_MARGIN = "(rhs - lhs) / tau"


def step_margins(batch: Instance, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """A step bound's margins ``(rhs - lhs) / tau`` (below ``-tolerance``: violated)."""
    return (rhs - lhs) / batch["radius"]


def _bound_check(name: str, budget: Budget, seed: int, make: Callable[..., Instance], sides: Sides,
                 control: NegativeControl) -> CheckResult:
    """Runs a ``lhs <= rhs`` step bound over every method and batch shape; margins are
    ``(rhs - lhs) / tau``."""
    size, _ = _SIZES[budget]
    rng = np.random.default_rng(seed)
    margins, ratios, runs = [], [], []
    for clients, dim in _shapes(budget, seed):
        batch = make(rng, size, clients, dim)
        for method in METHODS:
            lhs, rhs = sides(batch, method)
            margins.append(step_margins(batch, lhs, rhs))
            ratios.append(np.divide(lhs, rhs, out=np.zeros_like(lhs), where=rhs > 0))
            runs += [(batch, method, index) for index in range(size)]

    def describe(index: int) -> dict:
        batch, method, offset = runs[index]
        return {"method": method, **described(batch, lambda one: sides(one, method))(offset)}

    # lhs / rhs near 1 shows the bound is attained (the tight instances)
    return exact_verdict(name, np.concatenate(margins), describe, what=STEP_MARGIN,
                         details={"methods": list(METHODS),
                                  "largest_lhs_over_rhs": float(np.concatenate(ratios).max())},
                         control=control)


def _step_control(description: str, seed: int, make: Callable[..., Instance], sides: Sides) -> NegativeControl:
    """A step bound's margins on the control instances ``make`` (over
    :data:`_CONTROL_CLOUDS`) with the broken ``sides``, evaluated as the real ones."""
    rng = instances.control_rng(seed)
    margins = []
    for clients, dim in _CONTROL_CLOUDS:
        batch = make(rng, _CONTROL_SIZE, clients, dim)
        margins.append(step_margins(batch, *sides(batch, "direct")))
    return margin_control(description, np.concatenate(margins), STEP_MARGIN, TOLERANCE)


def _one_step_sides(batch: Instance, method: str) -> tuple[np.ndarray, np.ndarray]:
    return one_step_move_sides(batch["points"], batch["centre"], batch["radius"], method)


def _replacement_sides(batch: Instance, method: str) -> tuple[np.ndarray, np.ndarray]:
    return replacement_sides(batch["points"], batch["replacements"], batch["replaced"], batch["centre"],
                             batch["radius"], method)


def one_step_move_control(seed: int) -> NegativeControl:
    """Eq. (24)'s one-step bound on the step *without its threshold*
    (:func:`unthresholded_move_sides`) over :func:`instances.one_sided_clouds`, where
    the mean step moves by more than ``tau >= (#inside / N) tau``: every margin is
    below ``-m / N`` (``m >= 1`` points outside)."""
    def sides(batch: Instance, method: str) -> tuple[np.ndarray, np.ndarray]:
        return unthresholded_move_sides(batch["points"], batch["centre"], batch["radius"], method)

    return _step_control("the step without its threshold (the mean) on clouds pulled out of the ball", seed,
                         instances.one_sided_clouds, sides)


def replacement_control(seed: int) -> NegativeControl:
    """A.1's replacement bound on the step *without its threshold*
    (:func:`unthresholded_replacement_sides`) over :func:`instances.pushed_replacements`,
    where the outputs differ by more than ``2.5 beta tau``: every margin is below
    ``-beta / 2``."""
    def sides(batch: Instance, method: str) -> tuple[np.ndarray, np.ndarray]:
        return unthresholded_replacement_sides(batch["points"], batch["replacements"], batch["replaced"],
                                               batch["centre"], batch["radius"], method)

    return _step_control("the step without its threshold (the mean), replacements shifted by over 2.5 tau", seed,
                         instances.pushed_replacements, sides)


@register(
    "one-step-move",
    "Alg. 3, eq. (24)",
    "one step of Threshold-Clustering moves a centre by at most (#inside / N) tau",
    "exact",
)
def check_one_step_move(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(101, seed)
    with _one_thread():
        return _bound_check("one-step-move", budget, stream, instances.point_clouds, _one_step_sides,
                            one_step_move_control(stream))


@register(
    "replacement",
    "Alg. 3, eq. (24); A.1 (robustness to beta N bad points)",
    "replacing any beta N points moves one step's output (same centre, fixed radius) by at most 2 beta tau",
    "exact",
)
def check_replacement(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(102, seed)
    with _one_thread():
        return _bound_check("replacement", budget, stream, instances.replacement_pairs, _replacement_sides,
                            replacement_control(stream))


#: What the contraction and edge-attacker margins measure.
IDENTITY_MARGIN = "-(largest |identity residual| / tau)"


def identity_margins(steps: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """The margins of the contraction / edge-attacker identities: minus the larger of
    the step residual and the fixed-point residual (both over ``tau``)."""
    return -np.maximum(steps, fixed)


def ball_residuals(batch: Instance, attackers: int, methods: tuple[str, ...] = METHODS,
                   rounds: int = ROUNDS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`contraction_residuals` of one ball instance (keys of
    :func:`instances.ball_around_one_cluster`) for each of ``methods``, concatenated:
    step residuals, fixed-point residuals, and whether the membership held."""
    steps, fixed, members = [], [], []
    for method in methods:
        result = contraction_residuals(batch["honest"], batch["in_cluster"], batch["centre"], batch["radius"],
                                       rounds=rounds, method=method, attackers=attackers,
                                       direction=batch["direction"])
        steps.append(result["step"])
        fixed.append(fixed_point_residuals(result, batch["radius"]))
        members.append(result["membership"])
    return np.concatenate(steps), np.concatenate(fixed), np.concatenate(members)


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
        step, fix, member = ball_residuals(batch, attackers)
        steps.append(step)
        fixed.append(fix)
        members.append(member)
    return np.concatenate(steps), np.concatenate(fixed), {"membership_held": bool(np.concatenate(members).all())}


def _identity_verdict(name: str, steps: np.ndarray, fixed: np.ndarray, info: dict, what: str,
                      control: NegativeControl) -> CheckResult:
    if not info["membership_held"]:
        # the identities are conditional on the membership: a broken precondition is
        # a bug of the instance generator, not a counterexample
        raise RuntimeError(f"{name}: a constructed ball lost or gained a point")
    return exact_verdict(name, identity_margins(steps, fixed), what=what,
                         details={**info, "largest_step_residual": float(steps.max()),
                                  "largest_fixed_point_residual": float(fixed.max())},
                         control=control)


def _ball_control(description: str, balls: list[tuple[Instance, int]]) -> NegativeControl:
    """The identities' margins on control balls ``(instance, attackers)``, evaluated as
    the real ones (one method: the identity does not depend on it); the share of
    balls whose membership held (none should) goes into the details."""
    margins, members = [], []
    for batch, attackers in balls:
        steps, fixed, member = ball_residuals(batch, attackers, ("direct",))
        margins.append(identity_margins(steps, fixed))
        members.append(member)
    return margin_control(description, np.concatenate(margins), IDENTITY_MARGIN, TOLERANCE,
                          details={"membership_held_share": float(np.concatenate(members).mean())})


def contraction_control(seed: int) -> NegativeControl:
    """The contraction identity (A.1, Lemma 2) on balls that do not hold exactly
    cluster ``i``: :func:`instances.with_intruder` adds a point of no cluster inside
    the first ball, so the first step takes ``(z_o - v_0) / N`` more than the identity,
    a residual of ``1 / (2N)``: every margin is at most ``-1 / (2N)``."""
    rng = instances.control_rng(seed)
    balls = [(instances.with_intruder(rng, instances.ball_around_one_cluster(rng, _CONTROL_SIZE, cluster, others,
                                                                             0, dim)), 0)
             for cluster, others, dim in _CONTROL_BALLS]
    return _ball_control("a point of no cluster inside the first ball (the ball holds more than cluster i)", balls)


def edge_attacker_control(seed: int) -> NegativeControl:
    """The edge-attacker identity (A.1, Lemma 6) with more attackers than the cluster
    has points (``beta > delta_i``; Lemma 6 needs ``beta <= delta_i``):
    :func:`instances.ball_with_excess_attackers` puts the predicted fixed point
    ``(beta / delta) tau`` from the mean, outside the ball, so the cluster leaves the
    ball within :func:`instances.rounds_to_leave` ``+ 2 <= ROUNDS`` rounds and that
    step misses the identity by over ``1 / (2N)``."""
    rng = instances.control_rng(seed)
    balls = [(instances.ball_with_excess_attackers(rng, _CONTROL_SIZE, cluster, attackers, dim), attackers)
             for cluster, attackers, dim in _CONTROL_ATTACKS]
    return _ball_control("beta > delta_i: more edge attackers than cluster points", balls)


@register(
    "contraction",
    "A.1, Lemma 2 (ball holding exactly cluster i)",
    "if the ball holds exactly cluster i's points: v_l - mean_i = (1 - delta_i)(v_{l-1} - mean_i)",
    "exact",
)
def check_contraction(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(103, seed)
    with _one_thread():
        steps, fixed, info = _ball_check(budget, stream, lambda rng, cluster: 0)
        control = contraction_control(stream)
    return _identity_verdict("contraction", steps, fixed, info, IDENTITY_MARGIN, control)


@register(
    "edge-attacker",
    "A.1, Lemma 6 (bad points at the edge of the ball)",
    "beta N attackers at v_{l-1} + tau u with beta <= delta_i: v_l - mean_i = (1 - delta_i)(v_{l-1} - mean_i) "
    "+ beta tau u, fixed point mean_i + (beta / delta_i) tau u, reached at rate 1 - delta_i",
    "exact",
)
def check_edge_attacker(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    stream = statement_seed(104, seed)
    with _one_thread():
        steps, fixed, info = _ball_check(budget, stream, lambda rng, cluster: int(rng.integers(1, cluster + 1)))
        control = edge_attacker_control(stream)
    return _identity_verdict("edge-attacker", steps, fixed, info, IDENTITY_MARGIN, control)
