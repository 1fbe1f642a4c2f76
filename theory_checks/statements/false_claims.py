"""Statements that are false as printed, each with its corrected form.

* ``lemma1-max`` (Lemma 1, eq. 19 and the end of A.3): Assumption 5 with ``Delta^2 =
  1/2 (max_{j not~ i} ||grad f_j(x_i*)||)^2``.  The derivation bounds each pair by its
  own ``||grad f_j(x_i*)||^2``; taking the max over ``j`` breaks it for the pair with
  the smallest one (at ``x = x_i*``: ``||grad f_j(x_i*)||^2 >= 1/2 max^2`` is needed).
  The corrected form (min) is ``lemma1-pair`` in :mod:`.lemmas`.
* ``var-y-le-var-z`` (A.1, Lemma 4's "contractivity of the thresholding"): for the
  clipped point ``y = z 1(||z - v|| <= tau) + v 1(||z - v|| > tau)``, ``Var y <= Var z``.
  False: ``z = v + tau e`` or ``v + (tau + eps) e`` w.p. 1/2 gives ``Var z = eps^2/4``,
  ``Var y = tau^2/4``.  Corrected (``var-y-le-second-moment``): ``Var y <= E||y - v||^2
  <= E||z - v||^2`` (a variance is the smallest second moment about any point, and
  clipping to ``v`` only shortens ``z - v``).
* ``thm3.2-constant`` (A.2): the two-point construction gives ``E||mu1_hat - mu1||^2 >=
  sigma^4 / (4 Delta^2)`` when ``Delta^2 >= 2 sigma^2``.  The samples have one law under
  both hypotheses (``mu1 = delta p`` or ``0``), so the best estimator is the midpoint
  ``delta p / 2`` and the exact minimax error is ``(delta p)^2 / 4``.  With ``p = 1/2 -
  Delta / (2S)``, ``S = sqrt(4 sigma^2 + Delta^2)`` and ``delta = S`` (from ``Delta =
  (1 - 2p) delta``, ``sigma^2 = delta^2 p (1 - p)``): ``delta p = (S - Delta)/2``, so the
  error is ``(S - Delta)^2 / 16 = sigma^4 / (Delta^2 (1 + sqrt(1 + 4 sigma^2/Delta^2))^2)``,
  below ``sigma^4 / (4 Delta^2)`` for every ``sigma > 0``.  The proof's slip: it writes
  ``sigma^2 p / (4(1 - p)) = sigma^2 (S - Delta) / (4 Delta)``, but ``p / (1 - p) =
  (S - Delta) / (S + Delta)``.  Corrected (``thm3.2-corrected``): the error is at least
  ``sigma^4 / (8 Delta^2)`` whenever ``Delta^2 >= 2 sigma^2`` (the ratio to
  ``sigma^4/Delta^2`` decreases in ``sigma/Delta`` and is ``1/(1 + sqrt 3)^2 ~ 0.134 >=
  1/8`` at the boundary).

Each false statement's check runs a seeded random search and shrinks the first
violation (:mod:`.search`); the evaluators are public.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from theory_checks.bounds import lemma1_separation, lower_bound
from theory_checks.controls import margin_control
from theory_checks.statements import instances
from theory_checks.statements.lemmas import (
    curvature_range,
    gradients,
    gradients_at_optima,
    other_cluster,
    separation_constant,
)
from theory_checks.statements.registry import Budget, register, statement_seed
from theory_checks.statements.search import (
    TOLERANCE,
    Instance,
    SearchOutcome,
    batched,
    exact_verdict,
    plain,
    rounded_arrays,
    search_then_shrink,
    simpler_entries,
    simpler_values,
    with_value,
)
from theory_checks.types import CheckResult, NegativeControl

_SEARCH: dict[str, tuple[int, int]] = {"quick": (8, 250), "full": (80, 500)}  # (batches, batch size)
# Instances of each negative control (whatever the budget).
_CONTROL_INSTANCES = 300


def _search(budget: Budget, sample, margin, candidates, seed: int, valid) -> SearchOutcome:
    """:func:`search_then_shrink` with the budget's batches (one seed per statement)."""
    batches, size = _SEARCH[budget]
    return search_then_shrink(sample, margin, candidates, seed=seed, batches=batches, batch_size=size, valid=valid)


def _fails(name: str, outcome: SearchOutcome, counterexample: dict, evidence: str, details: dict) -> CheckResult:
    return CheckResult(name, "fails", instances=outcome.tried, worst_slack=outcome.margin,
                       counterexample=counterexample, evidence=evidence,
                       details={"violations": outcome.violations, "rate": outcome.rate,
                                "shrink_steps": outcome.shrink_steps, "first_found": plain(outcome.found), **details})


def _not_found(name: str, outcome: SearchOutcome) -> CheckResult:
    return CheckResult(name, "holds", instances=outcome.tried,
                       evidence=f"no counterexample in {outcome.tried} random instances "
                                "(one was expected: the search is too weak)")


# ------------------------------------------------------------------ Lemma 1 with the max

def max_form_sides(instance: Instance) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (19) as printed at ``instance["point"]``: ``lhs[B, N, N] = ||grad f_i(x) -
    grad f_j(x)||^2`` and ``rhs[B, N] = 1/2 (max_{j not~ i} ||grad f_j(x_i*)||)^2 - D^2
    ||grad f_i(x)||^2`` (``grad f_j(x_i*) = 0`` inside ``i``'s cluster, so the max may
    run over every ``j``)."""
    hessians, optima, clusters, point = (instance[k] for k in ("hessians", "optima", "clusters", "point"))
    grads = gradients(hessians, optima, clusters, point)
    lhs = np.square(grads[:, :, None, :] - grads[:, None, :, :]).sum(-1)
    norms = np.linalg.norm(gradients_at_optima(hessians, optima, clusters), axis=-1)
    rhs = lemma1_separation(norms, "max") - separation_constant(hessians)[:, None] * np.square(grads).sum(-1)
    return lhs, rhs


def max_form_margin(instance: Instance) -> np.ndarray:
    """``min_{i, j not~ i} (lhs_ij - rhs_i) / Delta_i^2`` with the printed ``Delta_i^2 =
    1/2 max_j ||grad f_j(x_i*)||^2``, ``[B]``; negative means eq. (19) fails."""
    lhs, rhs = max_form_sides(instance)
    norms = np.linalg.norm(gradients_at_optima(instance["hessians"], instance["optima"], instance["clusters"]), axis=-1)
    scale = lemma1_separation(norms, "max")
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = (lhs - rhs[:, :, None]) / scale[:, :, None]
    return np.where(other_cluster(instance["clusters"]), gap, np.inf).min(axis=(1, 2))


def _sample_quadratics(rng: np.random.Generator, size: int) -> Instance:
    clients = int(rng.integers(3, 9))
    clusters = int(rng.integers(2, min(clients, 4) + 1))
    return instances.quadratic_clusters(rng, size, clients, clusters, int(rng.integers(1, 5)))


def _drop_client(instance: Instance, client: int) -> Instance:
    keep = np.arange(instance["clusters"].size) != client
    labels = instance["clusters"][keep]
    used = np.unique(labels)
    return {"hessians": instance["hessians"][keep], "optima": instance["optima"][used],
            "clusters": np.searchsorted(used, labels), "point": instance["point"]}


def _drop_dim(instance: Instance, dim: int) -> Instance:
    keep = np.arange(instance["point"].size) != dim
    return {"hessians": instance["hessians"][:, keep][:, :, keep], "optima": instance["optima"][:, keep],
            "clusters": instance["clusters"], "point": instance["point"][keep]}


def _simpler_curvatures(instance: Instance) -> Iterator[Instance]:
    """Diagonal Hessians, identity Hessians, and simpler diagonal entries (symmetric)."""
    hessians = instance["hessians"]
    dim = hessians.shape[-1]
    diagonal = np.diagonal(hessians, axis1=-2, axis2=-1)
    yield with_value(instance, "hessians", diagonal[..., None] * np.eye(dim))
    for client in range(hessians.shape[0]):
        changed = hessians.copy()
        changed[client] = np.eye(dim)
        yield with_value(instance, "hessians", changed)
    if np.array_equal(hessians, diagonal[..., None] * np.eye(dim)):
        for client, axis in np.ndindex(diagonal.shape):
            for option in simpler_values(float(diagonal[client, axis])):
                changed = hessians.copy()
                changed[client, axis, axis] = option
                yield with_value(instance, "hessians", changed)


def quadratic_candidates(instance: Instance) -> Iterator[Instance]:
    """Shrink steps for a quadratic family: drop a client, drop a dimension, put the
    point at an optimum, simplify the Hessians, then the numbers."""
    for client in range(instance["clusters"].size):
        yield _drop_client(instance, client)
    for dim in range(instance["point"].size):
        yield _drop_dim(instance, dim)
    for optimum in instance["optima"]:
        yield with_value(instance, "point", optimum)
    yield from _simpler_curvatures(instance)
    yield from rounded_arrays(instance, ("hessians",))
    yield from simpler_entries(instance, ("optima", "point"))


def valid_quadratics(instance: Instance) -> bool:
    """Symmetric positive definite Hessians, at least two clusters, and distinct
    cluster optima (clusters with one optimum would be one cluster)."""
    hessians, optima = instance["hessians"], instance["optima"]
    if instance["clusters"].size < 2 or np.unique(instance["clusters"]).size < 2 or hessians.shape[-1] < 1:
        return False
    if np.unique(optima, axis=0).shape[0] < optima.shape[0]:
        return False
    if not np.allclose(hessians, np.swapaxes(hessians, -1, -2), rtol=0, atol=0):
        return False
    return bool(np.linalg.eigvalsh(hessians).min() > 0)


def _lemma1_counterexample(instance: Instance) -> dict:
    """The shrunk family with the violating pair's two sides and the constants."""
    batch = batched(instance)
    lhs, rhs = max_form_sides(batch)
    gap = np.where(other_cluster(batch["clusters"]), lhs - rhs[:, :, None], np.inf)[0]
    i, j = np.unravel_index(int(np.argmin(gap)), gap.shape)
    smoothness, convexity = curvature_range(batch["hessians"])
    norms = np.linalg.norm(gradients_at_optima(batch["hessians"], batch["optima"], batch["clusters"]), axis=-1)[0]
    return {**plain(instance), "i": int(i), "j": int(j), "L": float(smoothness[0]), "mu": float(convexity[0]),
            "D2": float(separation_constant(batch["hessians"])[0]), "grad_norms_at_x_i_star": norms[i].tolist(),
            "lhs": float(lhs[0, i, j]), "rhs": float(rhs[0, i])}


@register(
    "lemma1-max",
    "Lemma 1, eq. (19); A.3",
    "||grad f_i(x) - grad f_j(x)||^2 >= 1/2 (max_{j not~ i} ||grad f_j(x_i*)||)^2 - 2(1 + (L/mu)^2) "
    "||grad f_i(x)||^2, i.e. Assumption 5 with Delta = max_j ||grad f_j(x_i*)|| / sqrt 2",
    "false_as_printed",
    provenance="A.3 derives the inequality for one pair (i, j), with ||grad f_j(x_i*)||^2 / 2; the statement "
               "then takes the max over j, where only the min holds for every pair (lemma1-pair checks the "
               "per-pair form)",
)
def check_lemma1_max(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    outcome = _search(budget, _sample_quadratics, max_form_margin, quadratic_candidates, seed=statement_seed(301, seed), valid=valid_quadratics)
    if outcome.shrunk is None:
        return _not_found("lemma1-max", outcome)
    example = _lemma1_counterexample(outcome.shrunk)
    evidence = (f"fails on {outcome.violations} of {outcome.tried} random quadratic families "
                f"({100 * outcome.rate:.1f}%); "
                f"shrunk to {len(example['clusters'])} clients in {len(example['point'])}-D: at x = {example['point']} "
                f"pair ({example['i']}, {example['j']}) has lhs {example['lhs']:.4g} < rhs {example['rhs']:.4g}")
    return _fails("lemma1-max", outcome, example, evidence, {})


# ------------------------------------------------------------- Var(y) <= Var(z) (A.1)

def thresholded_moments(instance: Instance) -> dict[str, np.ndarray]:
    """For ``z`` on ``values[B, m, d]`` with ``probabilities[B, m]`` and the clipped
    ``y = z`` if ``||z - v|| <= tau`` else ``v`` (``v = centre``, ``tau = radius``):
    ``var_z``, ``var_y``, ``second_y = E||y - v||^2``, ``second_z = E||z - v||^2``.
    A control's broken clipping sends the points outside to ``instance["target"]``
    instead of ``v`` (:func:`instances.misclipped_distributions`); the moments stay
    about ``v``."""
    values, weights, centre, radius = (instance[k] for k in ("values", "probabilities", "centre", "radius"))
    target = instance.get("target", centre)
    offset = values - centre[:, None, :]
    inside = np.linalg.norm(offset, axis=-1) <= radius[:, None]
    clipped = np.where(inside[..., None], values, target[:, None, :])

    def variance(points: np.ndarray) -> np.ndarray:
        mean = np.einsum("bm,bmd->bd", weights, points)
        return np.einsum("bm,bm->b", weights, np.square(points - mean[:, None]).sum(-1))

    def second_moment(points: np.ndarray) -> np.ndarray:
        return np.einsum("bm,bm->b", weights, np.square(points - centre[:, None]).sum(-1))

    return {"var_z": variance(values), "var_y": variance(clipped),
            "second_y": second_moment(clipped), "second_z": second_moment(values)}


def variance_claim_margin(instance: Instance) -> np.ndarray:
    """``(Var z - Var y) / tau^2``: negative where the proof's ``Var y <= Var z`` fails."""
    moments = thresholded_moments(instance)
    return (moments["var_z"] - moments["var_y"]) / np.square(instance["radius"])


def second_moment_margins(instance: Instance) -> np.ndarray:
    """The corrected chain ``Var y <= E||y - v||^2 <= E||z - v||^2``: both gaps over
    ``tau^2``, ``[2, B]``."""
    moments = thresholded_moments(instance)
    scale = np.square(instance["radius"])
    return np.stack([(moments["second_y"] - moments["var_y"]) / scale,
                     (moments["second_z"] - moments["second_y"]) / scale])


def _sample_thresholded(rng: np.random.Generator, size: int) -> Instance:
    return instances.thresholded_distributions(rng, size, int(rng.integers(2, 6)), int(rng.integers(1, 4)))


def distribution_candidates(instance: Instance) -> Iterator[Instance]:
    """Shrink steps: drop an atom, drop a dimension, equal weights, the centre moved to
    the origin, the radius scaled to 1, the points reflected through the centre (these
    three leave the claim's sign unchanged), simpler numbers."""
    values, weights, centre, radius = (instance[k] for k in ("values", "probabilities", "centre", "radius"))
    for atom in range(weights.size):
        keep = np.arange(weights.size) != atom
        yield {**instance, "values": values[keep], "probabilities": weights[keep] / weights[keep].sum()}
    for dim in range(values.shape[1]):
        keep = np.arange(values.shape[1]) != dim
        yield {**instance, "values": values[:, keep], "centre": instance["centre"][keep]}
    yield with_value(instance, "probabilities", np.full(weights.size, 1.0 / weights.size))
    yield {**instance, "values": values - centre, "centre": np.zeros_like(centre)}
    yield {**instance, "values": centre + (values - centre) / radius, "radius": np.ones_like(radius)}
    yield with_value(instance, "values", 2.0 * centre - values)
    yield from simpler_entries(instance, ("centre", "radius", "values"))


def valid_distribution(instance: Instance) -> bool:
    weights = instance["probabilities"]
    return bool(weights.size >= 1 and (weights > 0).all() and abs(weights.sum() - 1.0) < 1e-12
                and instance["radius"] > 0)


@register(
    "var-y-le-var-z",
    "A.1, proof of Lemma 4 (contractivity of the thresholding)",
    "the clipped point y = z 1(||z - v|| <= tau) + v 1(||z - v|| > tau) has Var(y) <= Var(z)",
    "false_as_printed",
    provenance="A.1's proof of Lemma 4 uses Var(y) <= Var(z) for the clipped point; clipping moves the points "
               "outside the ball onto v, which can spread y more than z; the step needs only "
               "Var(y) <= E||y - v||^2 <= E||z - v||^2, which holds (var-y-le-second-moment)",
)
def check_var_y_le_var_z(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    outcome = _search(budget, _sample_thresholded, variance_claim_margin, distribution_candidates, seed=statement_seed(302, seed), valid=valid_distribution)
    if outcome.shrunk is None:
        return _not_found("var-y-le-var-z", outcome)
    moments = {key: float(value[0]) for key, value in thresholded_moments(batched(outcome.shrunk)).items()}
    example = {**plain(outcome.shrunk), **moments, "lhs": moments["var_y"], "rhs": moments["var_z"]}
    evidence = (f"fails on {outcome.violations} of {outcome.tried} random distributions; shrunk: z in "
                f"{example['values']} w.p. {example['probabilities']}, v = {example['centre']}, "
                f"tau = {example['radius']}: "
                f"Var y = {moments['var_y']:.4g} > Var z = {moments['var_z']:.4g}")
    return _fails("var-y-le-var-z", outcome, example, evidence, {})


def second_moment_control(seed: int) -> NegativeControl:
    """The corrected chain with a broken clipping: :func:`instances.misclipped_distributions`
    sends the points outside the ball to a target ``2.5 tau`` or more from ``v`` instead
    of to ``v`` (the hypothesis: ``y`` is the clipped point *at v*).  Every atom lies
    within ``2 tau`` of ``v`` and one lies outside, so ``E||y - v||^2 - E||z - v||^2 >=
    p_out (2.5^2 - 2^2) tau^2 > 0``: the second gap's margin is below ``-2.25 p_out``."""
    rng = instances.control_rng(seed)
    batches = [instances.misclipped_distributions(rng, _CONTROL_INSTANCES // 3, atoms, dim)
               for atoms, dim in ((2, 1), (3, 2), (5, 3))]
    margins = np.concatenate([second_moment_margins(batch).ravel() for batch in batches])
    return margin_control("outside points clipped to a point 2.5 tau or more from v, not to v", margins,
                          "gap / tau^2", TOLERANCE)


@register(
    "var-y-le-second-moment",
    "A.1, proof of Lemma 4 (corrected)",
    "Var(y) <= E||y - v||^2 <= E||z - v||^2 for the clipped point y",
    "corrected",
)
def check_var_y_le_second_moment(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    batches, size = _SEARCH[budget]
    stream = statement_seed(303, seed)
    rng = np.random.default_rng(stream)
    margins = np.concatenate([second_moment_margins(_sample_thresholded(rng, size)).ravel() for _ in range(batches)])
    return exact_verdict("var-y-le-second-moment", margins, what="gap / tau^2", control=second_moment_control(stream))


# ------------------------------------------------------------ Thm 3.2's constant (A.2)

def two_point_construction(sigma: np.ndarray | float, separation: np.ndarray | float) -> dict[str, np.ndarray]:
    """A.2's hard instance for ``(sigma, Delta)``: ``p = 1/2 - Delta / (2S)`` (eq. 93),
    ``delta = S = sqrt(4 sigma^2 + Delta^2)``, the two candidate means ``mu1 = delta p``
    (mixture M) and ``0`` (mixture M~), and the exact minimax error ``(delta p)^2 / 4``
    of estimating ``mu1`` from samples whose law is the same under both."""
    sigma, separation = np.asarray(sigma, float), np.asarray(separation, float)
    spread = np.sqrt(4.0 * sigma**2 + separation**2)
    p = 0.5 - separation / (2.0 * spread)
    mean = spread * p
    return {"p": p, "delta": spread, "mu1": mean, "error": mean**2 / 4.0}


def two_point_sides(instance: Instance, constant: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """``(exact minimax error, c sigma^4 / Delta^2)`` with the bound from
    :func:`theory_checks.bounds.lower_bound` (``c = 1/4`` as printed)."""
    sigma, separation = instance["sigma"], instance["separation"]
    return two_point_construction(sigma, separation)["error"], lower_bound(sigma, separation, constant=constant)


def two_point_margin(instance: Instance, constant: float = 0.25) -> np.ndarray:
    """``(error - bound) / bound``; negative where the lower bound fails."""
    error, bound = two_point_sides(instance, constant)
    return (error - bound) / bound


def _sample_two_point(rng: np.random.Generator, size: int) -> Instance:
    sigma = 10.0 ** rng.uniform(-2.0, 2.0, size)
    return {"sigma": sigma, "separation": sigma * np.sqrt(2.0) * 10.0 ** rng.uniform(0.0, 2.0, size)}


def valid_two_point(instance: Instance) -> bool:
    """The proof's regime: ``sigma > 0`` and ``Delta^2 >= 2 sigma^2``."""
    return bool(instance["sigma"] > 0 and instance["separation"] ** 2 >= 2.0 * instance["sigma"] ** 2)


def two_point_candidates(instance: Instance) -> Iterator[Instance]:
    yield from simpler_entries(instance, ("sigma", "separation"))


@register(
    "thm3.2-constant",
    "Theorem 3.2, proof in A.2",
    "the two-point construction has E||mu1_hat - mu1||^2 >= sigma^4 / (4 Delta^2) when Delta^2 >= 2 sigma^2",
    "false_as_printed",
    provenance="an algebra slip in A.2: plugging p = 1/2 - Delta / (2S), S = sqrt(4 sigma^2 + Delta^2), into "
               "sigma^2 p / (4 (1 - p)) (eq. 94) writes p / (1 - p) as (S - Delta) / Delta instead of "
               "(S - Delta) / (S + Delta); the exact error is then (S - Delta)^2 / 16, and the constant that "
               "holds for Delta^2 >= 2 sigma^2 is 1/8 (thm3.2-corrected)",
)
def check_thm32_constant(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    return two_point_constant_check("thm3.2-constant", statement_seed(304, seed), budget)


def two_point_constant_check(name: str, stream: int, budget: Budget) -> CheckResult:
    """Search for and shrink a ``(sigma, Delta)`` with ``Delta^2 >= 2 sigma^2`` where the
    two-point construction's exact error is below ``sigma^4 / (4 Delta^2)`` (the
    constant of Thm 3.2's A.2 and of the workshop's Thm 2, A.3), reported as ``name``."""
    outcome = _search(budget, _sample_two_point, two_point_margin, two_point_candidates, seed=stream,
                      valid=valid_two_point)
    if outcome.shrunk is None:
        return _not_found(name, outcome)
    error, bound = (float(side[0]) for side in two_point_sides(batched(outcome.shrunk)))
    construction = {key: float(value) for key, value in two_point_construction(**outcome.shrunk).items()}
    example = {**plain(outcome.shrunk), **construction, "lhs": error, "rhs": bound, "ratio": error / bound}
    evidence = (f"fails on {outcome.violations} of {outcome.tried} random (sigma, Delta) with Delta^2 >= 2 sigma^2; "
                f"sigma = {example['sigma']:g}, Delta = {example['separation']:g}: exact error (S - Delta)^2/16 = "
                f"{error:.4g} < sigma^4/(4 Delta^2) = {bound:.4g} (ratio {error / bound:.3f})")
    return _fails(name, outcome, example, evidence, {})


#: Below this ``Delta / sigma`` the corrected bound fails on the two-point
#: construction: error / bound ``= 8 / (sqrt(1 + 4 sigma^2/Delta^2) + 1)^2`` increases in
#: ``Delta / sigma`` and is 1 at ``Delta / sigma = 2 / sqrt((2 sqrt 2 - 1)^2 - 1) ~ 1.307``,
#: inside ``Delta^2 < 2 sigma^2`` (``Delta / sigma < 1.414``).
BREAK_SEPARATION = 2.0 / np.sqrt((2.0 * np.sqrt(2.0) - 1.0) ** 2 - 1.0)

# The control's largest Delta / sigma: safely below BREAK_SEPARATION.
_CONTROL_SEPARATION = 1.2


def sample_two_point_outside_regime(rng: np.random.Generator, size: int) -> Instance:
    """``(sigma, Delta)`` outside Thm 3.2's regime ``Delta^2 >= 2 sigma^2``: ``Delta /
    sigma`` log-uniform in ``(0.01, 1.2)``, below :data:`BREAK_SEPARATION`, where the
    error ``(S - Delta)^2 / 16`` is below ``sigma^4 / (8 Delta^2)`` (their ratio tends to
    ``2 Delta^2 / sigma^2 -> 0`` as ``Delta -> 0``)."""
    sigma = 10.0 ** rng.uniform(-2.0, 2.0, size)
    return {"sigma": sigma,
            "separation": sigma * 10.0 ** rng.uniform(-2.0, np.log10(_CONTROL_SEPARATION), size)}


def thm32_corrected_control(seed: int) -> NegativeControl:
    """The corrected constant 1/8 outside the regime ``Delta^2 >= 2 sigma^2``
    (:func:`sample_two_point_outside_regime`): every margin is below ``8 / (sqrt(1 + 4 /
    1.2^2) + 1)^2 - 1 ~ -0.077``."""
    batch = sample_two_point_outside_regime(instances.control_rng(seed), _CONTROL_INSTANCES)
    return margin_control("Delta^2 < 2 sigma^2 (Delta / sigma < 1.2), outside the theorem's regime",
                          two_point_margin(batch, 0.125), "(error - sigma^4/(8 Delta^2)) / bound", TOLERANCE)


@register(
    "thm3.2-corrected",
    "Theorem 3.2, proof in A.2 (corrected)",
    "the two-point construction's exact minimax error (S - Delta)^2/16 is >= sigma^4 / (8 Delta^2) whenever "
    "Delta^2 >= 2 sigma^2",
    "corrected",
)
def check_thm32_corrected(budget: Budget = "quick", seed: int = 0) -> CheckResult:
    batches, size = _SEARCH[budget]
    stream = statement_seed(305, seed)
    rng = np.random.default_rng(stream)
    samples = [_sample_two_point(rng, size) for _ in range(batches)]
    boundary = {"sigma": np.array([1.0, 0.1, 3.0]), "separation": np.sqrt(2.0) * np.array([1.0, 0.1, 3.0])}
    margins = np.concatenate([two_point_margin(batch, 0.125) for batch in [*samples, boundary]])
    return exact_verdict("thm3.2-corrected", margins, what="(error - sigma^4/(8 Delta^2)) / bound",
                         tolerance=TOLERANCE, control=thm32_corrected_control(stream))
