"""Gradient noise: Assumption 6 (eq. 20) measured on a client's own samples, and the
variance a batch (Lemma 7, eq. 124) or a momentum (Lemma 14, eq. 228) leaves of it."""

from __future__ import annotations

import math
from typing import Callable

from torch import Tensor

from robust_pfl.engine.data import Batch
from robust_pfl.engine.objectives import Objective
from theory_checks.estimators.fractions import included_clients
from theory_checks.types import Estimate

# (client, sample, coordinate) entries of per-sample gradients held at once by default.
_SAMPLE_BLOCK = 1 << 22


def per_sample_gradients(objective: Objective) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``(params[k, d], inputs[k, s, ...], targets[k, s, ...]) -> [k, s, d]``: the
    gradient of ``objective.loss`` on each one-sample batch, as the objective's own
    batched gradients of ``k s`` one-sample clients (every model repeated per sample;
    the dense networks' hand-written backward pass instead of a vmapped autograd)."""

    def gradients(params: Tensor, inputs: Tensor, targets: Tensor) -> Tensor:
        clients, samples = inputs.shape[:2]
        single = Batch(inputs.reshape(clients * samples, 1, *inputs.shape[2:]),
                       targets.reshape(clients * samples, 1, *targets.shape[2:]))
        return objective.paired_gradients(params.repeat_interleave(samples, 0), single).reshape(clients, samples, -1)

    return gradients


def gradient_noise(objective: Objective, params: Tensor, data: Batch, include: Tensor | None = None,
                   chunk: int | None = None) -> Estimate:
    """``sigma^2`` of Assumption 6 (eq. 20) on the clients' local sets:
    ``sigma_i^2 = (1/n) sum_s ||grad l(x_i; s) - grad f_i(x_i)||^2`` at client ``i``'s
    model ``params[i]``, maximised over included clients.

    Two passes over chunks of ``chunk`` samples (the mean, then the deviations), so no
    more than ``k * chunk * d`` per-sample gradient entries exist at once (default
    about ``_SAMPLE_BLOCK``).  ``where = {"client": i}``; ``details["per_client"]``
    (``nan`` for excluded clients)."""
    if not isinstance(params, Tensor) or params.dim() != 2 or not params.dtype.is_floating_point:
        raise ValueError(f"params must be a floating tensor [N, d], got {tuple(getattr(params, 'shape', ()))}")
    clients, dim = params.shape
    if data.inputs.shape[0] != clients or data.targets.shape[0] != clients:
        raise ValueError(f"data must hold the {clients} clients of params, got {data.inputs.shape[0]}")
    samples = data.inputs.shape[1]
    if samples < 1:
        raise ValueError("data must hold at least one sample per client")
    index = included_clients(include, clients, params.device)
    chosen = params.index_select(0, index)
    inputs = data.inputs.index_select(0, index.to(data.inputs.device))
    targets = data.targets.index_select(0, index.to(data.targets.device))
    if chunk is None:
        chunk = max(1, _SAMPLE_BLOCK // max(1, index.numel() * dim))
    elif chunk < 1:
        raise ValueError(f"chunk must be >= 1 samples, got {chunk}")
    gradients = per_sample_gradients(objective)
    starts = range(0, samples, chunk)
    total = chosen.new_zeros(chosen.shape)
    for first in starts:
        total += gradients(chosen, inputs[:, first : first + chunk], targets[:, first : first + chunk]).sum(1)
    mean = (total / samples).unsqueeze(1)
    deviation = chosen.new_zeros(index.numel())
    for first in starts:
        block = gradients(chosen, inputs[:, first : first + chunk], targets[:, first : first + chunk])
        deviation += (block - mean).square().sum((1, 2))
    variance = deviation / samples
    best = int(variance.argmax())
    per_client = params.new_full((clients,), math.nan)
    per_client[index] = variance
    return Estimate(
        "sigma2", float(variance[best]), "max", index.numel(), {"client": int(index[best])},
        {"per_client": per_client.tolist(), "samples_per_client": samples},
    )


def batch_noise(sigma2: float | Tensor, batch_size: int, samples: int | None = None) -> float | Tensor:
    """Lemma 7 (eq. 124): the variance of a mean over a batch of ``|B|`` samples whose
    single-sample variance is ``sigma^2``.  iid draws (with replacement,
    ``samples=None``): ``sigma^2 / |B|``.  Without replacement from ``n = samples``
    samples (``sigma^2`` the population variance, as in :func:`gradient_noise`):
    ``sigma^2 (n - |B|) / (|B| (n - 1))``, exactly (0 when ``|B| = n``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if samples is None:
        return sigma2 / batch_size
    if samples < batch_size:
        raise ValueError(f"samples must be >= batch_size ({batch_size}) without replacement, got {samples}")
    if samples == batch_size:
        return sigma2 * 0.0
    return sigma2 * (samples - batch_size) / (batch_size * (samples - 1))


def momentum_noise(alpha: float, sigma2: float, rounds: int | None = None) -> float:
    """Variance of ``m_t = alpha g_t + (1 - alpha) m_{t-1}``, ``m_0 = 0``, for
    independent ``g_t`` of variance ``sigma^2``:
    ``alpha sigma^2 (1 - (1 - alpha)^(2t)) / (2 - alpha)`` after ``t = rounds``;
    ``rounds=None`` gives the stationary ``alpha sigma^2 / (2 - alpha)``.  Lemma 14
    (eq. 228) claims ``<= alpha sigma^2``, which these values satisfy."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if sigma2 < 0:
        raise ValueError(f"sigma2 must be >= 0, got {sigma2}")
    stationary = alpha * sigma2 / (2 - alpha)
    if rounds is None:
        return stationary
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    return stationary * (1 - (1 - alpha) ** (2 * rounds))
