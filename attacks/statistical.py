"""Attacks built from honest-row statistics: ALIE, IPM and mimic (all omniscient)."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated, ClassVar

from pydantic import Field
from torch import Tensor

from attacks._stats import client_row, expand_rows, honest_block, honest_mean, mean_and_std
from attacks.base import attack_options, register
from robust_pfl.engine.types import AttackBase, AttackContext


def alie_z(senders: int, byzantine: int) -> float:
    """Baruch et al. (2019), the choice of ``z_max``: with ``n`` senders of which ``f`` Byzantine, the
    attacker needs ``s = floor(n/2 + 1) - f`` honest "supporters", and
    ``z = Phi^{-1}((n - s) / n)`` (``Phi`` the standard normal CDF).

    Outside the paper's regime the formula degenerates; ``s`` is clamped to ``>= 1``
    (``f`` past a majority would give ``s <= 0`` and ``z = inf``) and ``z`` to
    ``>= 0`` (``(n - s)/n <= 1/2`` only when ``f = 0`` or ``n = 1``).
    """
    n = senders
    s = max(math.floor(n / 2 + 1) - byzantine, 1)
    p = (n - s) / n if n > 0 else 0.0
    return NormalDist().inv_cdf(p) if p > 0.5 else 0.0


@register
@attack_options
class ALIE(AttackBase):
    """"A little is enough" (Baruch, Baruch & Goldberg, NeurIPS 2019): every
    Byzantine row is, per coordinate, ``mean_j - z * std_j`` of the honest rows, a
    shift small enough to stay within the honest spread yet consistent across all
    Byzantine clients.

    ``std`` is the sample (Bessel-corrected) standard deviation, as ``torch.std`` in the
    authors' code.  ``z = None`` computes ``z`` from ``n = S`` (all senders of the
    call) and ``f = B`` with :func:`alie_z`; a given ``z`` must be ``>= 0``.
    """

    name: ClassVar[str] = "alie"
    summary: ClassVar[str] = "honest mean - z * honest std per coordinate (Baruch et al. 2019)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient"})
    z: Annotated[float | None, Field(ge=0, description="the shift in honest stds (None: Baruch et al.'s z_max)")] = None

    def z_for(self, context: AttackContext) -> float:
        """The ``z`` used for this call."""
        if self.z is not None:
            return float(self.z)
        return alie_z(int(context.byzantine.numel()), int(context.byzantine.sum()))

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        mean, std = mean_and_std(honest_block(messages, context))
        return expand_rows(mean - self.z_for(context) * std, messages, context)


@register
@attack_options
class IPM(AttackBase):
    """Inner-product manipulation (Xie, Koyejo & Gupta, "Fall of empires", UAI 2019 /
    PMLR 115, 2020): every Byzantine row is ``-eps * mean`` of the honest rows, so that
    its inner product with the honest mean, ``-eps ||mean||^2``, is negative."""

    name: ClassVar[str] = "ipm"
    summary: ClassVar[str] = "-eps * honest mean (Xie et al. 2020, inner product manipulation)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient"})
    eps: Annotated[float, Field(gt=0, description="the rows sent are -eps * the honest mean")] = 0.1

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return expand_rows(honest_mean(messages, context) * -self.eps, messages, context)


@register
@attack_options
class Mimic(AttackBase):
    """Mimic (Karimireddy, He & Jaggi, ICLR 2022): every Byzantine client copies one
    honest client's row, over-weighting it.  ``client`` is a global client index;
    ``None`` (or a client absent from the call or Byzantine) copies the honest sender
    with the lowest global index."""

    name: ClassVar[str] = "mimic"
    summary: ClassVar[str] = "copy one honest client's row (Karimireddy et al. 2022)"
    needs: ClassVar[frozenset[str]] = frozenset({"omniscient"})
    client: Annotated[
        int | None, Field(ge=0, description="the global index of the client copied (None: the lowest honest one)")
    ] = None

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return expand_rows(client_row(messages, context, self.client), messages, context)
