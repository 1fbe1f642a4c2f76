"""Curvature of the local losses: the smoothness ``L`` of Assumption 7 (eq. 21) and,
for convex losses, the strong convexity ``mu`` that Lemma 1 (eq. 18-19) builds ``A``
and ``D`` from.  Both from the Hessian of the full local loss ``f_i`` at ``x_i``."""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from torch import Tensor
from torch.func import grad, hessian, jvp, vmap

from robust_pfl.engine.data import Batch
from robust_pfl.engine.objectives import Objective
from theory_checks.estimators.fractions import included_clients
from theory_checks.types import Estimate

Method = Literal["power", "lanczos", "dense"]

# Largest dimension for which dense Hessians are formed.
DENSE_MAX_DIM = 4096
# Hessian entries formed at once by the dense method (a loop over client chunks).
_DENSE_BLOCK = 1 << 24
# A smallest eigenvalue above -_CONVEX_SLACK * (largest |eigenvalue|) counts as convex.
_CONVEX_SLACK = 1e-9


def _local_problem(objective: Objective, params: Tensor, data: Batch, include: Tensor | None,
                   iterations: int, tol: float, method: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validated inputs: the included clients' ``(index, params, inputs, targets)``."""
    if not isinstance(params, Tensor) or params.dim() != 2 or not params.dtype.is_floating_point:
        raise ValueError(f"params must be a floating tensor [N, d], got {tuple(getattr(params, 'shape', ()))}")
    if data.inputs.shape[0] != params.shape[0] or data.targets.shape[0] != params.shape[0]:
        raise ValueError(f"data must hold the {params.shape[0]} clients of params, got {data.inputs.shape[0]}")
    if method not in ("power", "lanczos", "dense"):
        raise ValueError(f"method must be 'power', 'lanczos' or 'dense', got {method!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    index = included_clients(include, params.shape[0], params.device)
    return (index, params.index_select(0, index), data.inputs.index_select(0, index.to(data.inputs.device)),
            data.targets.index_select(0, index.to(data.targets.device)))


def hessian_vector_products(objective: Objective) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """``(params[k, d], vectors[k, d], inputs[k, ...], targets[k, ...]) -> [k, d]``:
    ``H_i v_i`` with ``H_i`` the Hessian of ``objective.loss`` at ``params[i]`` on
    client ``i``'s data (forward-over-reverse: ``jvp`` of ``grad``, vmapped)."""

    def product(params: Tensor, vector: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        gradient = grad(objective.loss)
        return jvp(lambda point: gradient(point, inputs, targets), (params,), (vector,))[1]

    return vmap(product)


def _power_iteration(apply: Callable[[Tensor], Tensor], start: Tensor, quotient: Callable[[Tensor, Tensor], Tensor],
                     iterations: int, tol: float) -> tuple[Tensor, int, bool]:
    """Batched power iteration ``v <- B v / ||B v||`` on ``start[k, d]``; stops once
    every row's ``quotient(v, B v)`` changes by at most ``tol`` relative.  Returns the
    last quotients, the iterations run and whether all rows converged."""
    vector = start / start.norm(dim=-1, keepdim=True)
    previous = None
    for step in range(1, iterations + 1):
        image = apply(vector)
        current = quotient(vector, image)
        if previous is not None and bool(((current - previous).abs() <= tol * current.abs()).all()):
            return current, step, True
        previous = current
        size = image.norm(dim=-1, keepdim=True)
        vector = torch.where(size > 0, image / size.clamp_min(torch.finfo(size.dtype).tiny), vector)
    return current, iterations, False


def _start_vectors(shape: torch.Size, like: Tensor, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=like.dtype).to(like.device)


def _largest_magnitude(objective: Objective, params: Tensor, inputs: Tensor, targets: Tensor,
                       iterations: int, tol: float, seed: int) -> tuple[Tensor, int, bool]:
    """``max |eigenvalue|`` of each client's Hessian as ``||H v||`` (the square root of
    ``H^2``'s Rayleigh quotient, which stays right when ``+lambda`` and ``-lambda``
    tie)."""
    products = hessian_vector_products(objective)
    return _power_iteration(
        lambda vector: products(params, vector, inputs, targets), _start_vectors(params.shape, params, seed),
        lambda vector, image: image.norm(dim=-1), iterations, tol,
    )


def lanczos_extremes(apply: Callable[[Tensor], Tensor], start: Tensor, steps: int,
                     tol: float = 1e-9) -> tuple[Tensor, Tensor, int, bool]:
    """``(smallest, largest)`` Ritz values ``[k]`` of the symmetric operators ``apply``
    (batched over rows, ``[k, d] -> [k, d]``) after ``steps`` Lanczos steps from
    ``start[k, d]`` (full reorthogonalisation), the steps run and whether the extremes
    moved by at most ``tol`` relative in the last one.

    The Krylov space of ``m`` steps holds the extreme eigenvalues far better than ``m``
    power iterations (Chebyshev acceleration): a dozen steps resolve them to a few
    digits.  Ritz values lie inside the spectrum: ``largest <= lambda_max`` and
    ``smallest >= lambda_min``.  A row whose Krylov space closes early (``d`` small, or
    a start in an invariant subspace) stops there; its remaining entries repeat a Ritz
    value, which leaves the extremes as they are."""
    rows, dim = start.shape
    steps = max(1, min(steps, dim))
    basis = start.new_zeros(rows, steps, dim)  # row r's Lanczos vectors, one per step
    basis[:, 0] = start / start.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(start.dtype).tiny)
    alphas, betas = start.new_zeros(rows, steps), start.new_zeros(rows, steps)
    active = torch.ones(rows, dtype=torch.bool, device=start.device)
    extremes: list[tuple[Tensor, Tensor]] = []
    for step in range(steps):
        image = apply(basis[:, step])
        alphas[:, step] = torch.where(active, (image * basis[:, step]).sum(-1), alphas[:, 0])
        done = basis[:, : step + 1]  # [k, s, d]
        # one full reorthogonalisation pass: the few steps taken lose little orthogonality
        image = image - torch.bmm(torch.bmm(done, image.unsqueeze(-1)).transpose(1, 2), done).squeeze(1)
        size = image.norm(dim=-1)
        scale = alphas[:, : step + 1].abs().amax(-1).clamp_min(torch.finfo(start.dtype).tiny)
        active = active & (size > 1e3 * torch.finfo(start.dtype).eps * scale)
        extremes.append(_ritz_extremes(alphas[:, : step + 1], betas[:, : step]))
        if step + 1 == steps or not bool(active.any()):
            break
        betas[:, step] = torch.where(active, size, 0.0)
        basis[:, step + 1] = torch.where(active.unsqueeze(-1), image / size.clamp_min(1e-300).unsqueeze(-1), 0.0)
    smallest, largest = extremes[-1]
    complete = len(extremes) < steps or steps == dim  # the Krylov space closed: the extremes are exact
    converged = complete or (len(extremes) >= 2 and bool(
        (((smallest - extremes[-2][0]).abs() <= tol * smallest.abs().clamp_min(largest.abs()))
         & ((largest - extremes[-2][1]).abs() <= tol * largest.abs())).all()))
    return smallest, largest, len(extremes), converged


def _ritz_extremes(alphas: Tensor, betas: Tensor) -> tuple[Tensor, Tensor]:
    """Smallest and largest eigenvalues of the tridiagonal matrices with diagonals
    ``alphas[k, m]`` and off-diagonals ``betas[k, m - 1]``."""
    tridiagonal = torch.diag_embed(alphas) + torch.diag_embed(betas, 1) + torch.diag_embed(betas, -1)
    values = torch.linalg.eigvalsh(tridiagonal)
    return values[:, 0], values[:, -1]


def _lanczos(objective: Objective, params: Tensor, inputs: Tensor, targets: Tensor,
             steps: int, tol: float, seed: int) -> tuple[Tensor, Tensor, int, bool]:
    products = hessian_vector_products(objective)
    return lanczos_extremes(lambda vector: products(params, vector, inputs, targets),
                            _start_vectors(params.shape, params, seed), steps, tol)


def _dense_spectra(objective: Objective, params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
    """Eigenvalues ``[k, d]`` (ascending) of every client's symmetrised Hessian."""
    dim = params.shape[1]
    if dim > DENSE_MAX_DIM:
        raise ValueError(f"method='dense' forms d x d Hessians: d = {dim} exceeds {DENSE_MAX_DIM}; use method='power'")
    hessians = vmap(hessian(objective.loss))
    step = max(1, _DENSE_BLOCK // (dim * dim))
    spectra = []
    for first in range(0, params.shape[0], step):
        block = hessians(params[first : first + step], inputs[first : first + step], targets[first : first + step])
        spectra.append(torch.linalg.eigvalsh(0.5 * (block + block.transpose(1, 2))))
    return torch.cat(spectra)


def _per_client(values: Tensor, index: Tensor, clients: int) -> list[float]:
    full = values.new_full((clients,), math.nan)
    full[index] = values
    return full.tolist()


def smoothness(objective: Objective, params: Tensor, data: Batch, include: Tensor | None = None,
               iterations: int = 500, tol: float = 1e-12, seed: int = 0, method: Method = "power") -> Estimate:
    """``L`` of Assumption 7 (eq. 21) at the clients' models: the largest ``|eigenvalue|``
    of the Hessian of the full local loss ``f_i`` at ``params[i]``, maximised over
    included clients.  ``"power"``: batched power iteration on Hessian-vector products
    (``iterations``, relative ``tol``, start vectors from ``seed``); ``"lanczos"``:
    ``iterations`` Lanczos steps on the same products (:func:`lanczos_extremes`, a
    lower bound that a dozen steps bring within a few digits); ``"dense"``: full
    Hessians and ``eigvalsh`` (``d <= 4096``).

    ``where = {"client": i}``; ``details``: ``per_client``, ``iterations``,
    ``converged``."""
    index, chosen, inputs, targets = _local_problem(objective, params, data, include, iterations, tol, method)
    if method == "dense":
        spectra = _dense_spectra(objective, chosen, inputs, targets)
        largest, steps, converged = spectra.abs().amax(-1), 0, True
    elif method == "lanczos":
        low, high, steps, converged = _lanczos(objective, chosen, inputs, targets, iterations, tol, seed)
        largest = torch.maximum(low.abs(), high.abs())
    else:
        largest, steps, converged = _largest_magnitude(objective, chosen, inputs, targets, iterations, tol, seed)
    best = int(largest.argmax())
    return Estimate(
        "L", float(largest[best]), "max", index.numel(), {"client": int(index[best])},
        {"per_client": _per_client(largest, index, params.shape[0]), "iterations": steps, "converged": converged},
    )


def strong_convexity(objective: Objective, params: Tensor, data: Batch, include: Tensor | None = None,
                     iterations: int = 500, tol: float = 1e-12, seed: int = 0, method: Method = "power") -> Estimate:
    """``mu``: the smallest Hessian eigenvalue of ``f_i`` at ``params[i]``, minimised
    over included clients (Lemma 1 needs ``mu > 0``).  ``"power"``: power iteration
    on ``c_i I - H_i``, ``c_i`` the client's largest ``|eigenvalue|`` (so the top
    eigenvalue is ``c_i - lambda_min``; the shift is exact, only the top is
    iterated); ``"lanczos"``: the smallest Ritz value of :func:`lanczos_extremes` (an
    upper bound on ``lambda_min``); ``"dense"`` as in :func:`smoothness`.

    A negative value means the loss is not convex there: ``details["convex"]`` is
    False when ``mu < -1e-9 * max |eigenvalue|`` (rounding allowance).  ``where =
    {"client": i}``; ``details``: ``per_client``, ``iterations``, ``converged``."""
    index, chosen, inputs, targets = _local_problem(objective, params, data, include, iterations, tol, method)
    if method == "dense":
        spectra = _dense_spectra(objective, chosen, inputs, targets)
        smallest, scale, steps, converged = spectra[:, 0], spectra.abs().amax(-1), 0, True
    elif method == "lanczos":
        smallest, high, steps, converged = _lanczos(objective, chosen, inputs, targets, iterations, tol, seed)
        scale = torch.maximum(smallest.abs(), high.abs())
    else:
        scale, first_steps, first_converged = _largest_magnitude(
            objective, chosen, inputs, targets, iterations, tol, seed)
        products = hessian_vector_products(objective)
        shift = scale.unsqueeze(-1)
        top, second_steps, second_converged = _power_iteration(
            lambda vector: shift * vector - products(chosen, vector, inputs, targets),
            _start_vectors(chosen.shape, chosen, seed + 1),
            lambda vector, image: (vector * image).sum(-1), iterations, tol,
        )
        smallest = scale - top
        steps, converged = first_steps + second_steps, first_converged and second_converged
    best = int(smallest.argmin())
    value = float(smallest[best])
    return Estimate(
        "mu", value, "min", index.numel(), {"client": int(index[best])},
        {"per_client": _per_client(smallest, index, params.shape[0]), "iterations": steps, "converged": converged,
         "convex": value >= -_CONVEX_SLACK * float(scale.max())},
    )
