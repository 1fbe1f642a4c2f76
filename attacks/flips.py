"""Bit flip (sign flip): send minus an honest gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from attacks._stats import client_row, expand_rows, honest_mean, own_rows
from attacks.base import NeedsBy, register, require_choice, require_finite, require_int
from robust_pfl.types import AttackContext

SOURCES = ("own", "client", "mean")


@register
@dataclass(frozen=True)
class BitFlip:
    """Bit-flip (sign-flip) attack: every Byzantine row is ``-scale * g``.

    ``source`` picks ``g``:

    * ``"own"`` (default): the Byzantine client's own honest row, exactly ``-g_i``
      (needs nothing beyond the client's own data);
    * ``"client"``: the row of global client ``client`` (default 0: the official code
      flips client 0's gradient).  If that client is not among this call's senders
      (``context.senders``) or is Byzantine, the honest sender with the lowest global
      index present is flipped instead;
    * ``"mean"``: the honest mean of every leading block.

    ``"client"`` and ``"mean"`` read honest rows (``needs = {"omniscient"}``).
    """

    name: ClassVar[str] = "bit_flip"
    summary: ClassVar[str] = "send -scale * g: own honest row, one honest client's row, or the honest mean"
    needs = NeedsBy(frozenset({"omniscient"}), lambda self: frozenset() if self.source == "own" else {"omniscient"})
    source: str = "own"
    client: int = 0
    scale: float = 1.0

    def __post_init__(self) -> None:
        require_choice(self.name, "source", self.source, SOURCES)
        require_int(self.name, "client", self.client, low=0)
        require_finite(self.name, "scale", self.scale)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        if self.source == "own":
            flipped = own_rows(messages, context)
        elif self.source == "client":
            flipped = expand_rows(client_row(messages, context, self.client), messages, context)
        else:
            flipped = expand_rows(honest_mean(messages, context), messages, context)
        return flipped.mul_(-self.scale)
