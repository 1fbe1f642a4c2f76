"""Bit flip (sign flip): send minus an honest gradient."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import client_row, expand_rows, honest_mean, own_rows
from attacks.base import NeedsBy, attack_options, register
from robust_pfl.engine.types import AttackBase, AttackContext

Source = Literal["own", "client", "client_model", "mean"]
SOURCES = get_args(Source)


@register
@attack_options
class BitFlip(AttackBase):
    """Bit-flip (sign-flip) attack: every Byzantine row is ``-scale * g``.

    ``source`` picks ``g``:

    * ``"own"`` (default): the Byzantine client's own honest row, exactly ``-g_i``
      (needs nothing beyond the client's own data);
    * ``"client"``: the row of global client ``client`` (default 0) in this message
      set.  In Federated-Clustering, whose messages to receiver ``i`` are evaluated at
      ``x_i``, that is ``g_c(x_i)``: a different vector for every receiver.  If that
      client is not among this call's senders (``context.senders``) or is Byzantine,
      the honest sender with the lowest global index present is flipped instead;
    * ``"client_model"``: the official FC code's rule (its Fig. 6 run): one vector,
      client ``client``'s gradient at client ``client``'s own model on this round's
      batch, ``g_c(x_c)``, sent to every receiver.  In FC it is read from
      ``context.defense_state["client_gradient"]`` (a Byzantine or unknown ``client``
      gives the honest client of lowest index); wherever the messages are the
      clients' own vectors (MC, Myopic, Global: not ``"cross_gradient"``), client
      ``c``'s row already is ``g_c(x_c)`` and it is the same as ``"client"``;
    * ``"mean"``: the honest mean of every leading block.

    Every source but ``"own"`` reads honest vectors (``needs = {"omniscient"}``) and
    only those (``reads_own_rows`` is false), so engines skip the Byzantine senders'
    honest gradients.
    """

    name: ClassVar[str] = "bit_flip"
    summary: ClassVar[str] = (
        "send -scale * g: own honest row (default), client c's row, client c's gradient at its own "
        "model to every receiver (client_model, the official FC code), or the honest mean"
    )
    needs = NeedsBy(frozenset({"omniscient"}), lambda self: frozenset() if self.source == "own" else {"omniscient"})
    source: Annotated[Source, Field(description="what is flipped: own | client | client_model | mean")] = "own"
    client: Annotated[int, Field(ge=0, description="the global client index of the client sources")] = 0
    scale: Annotated[float, Field(description="the rows sent are -scale * g")] = 1.0

    @property
    def reads_own_rows(self) -> bool:
        return self.source == "own"

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return expand_rows(self._flipped(messages, context), messages, context).mul_(-self.scale)

    def write_from(self, messages: Tensor, rows: Tensor, context: AttackContext) -> None:
        """Write the rows :meth:`__call__` returns into ``rows``, the Byzantine block
        of ``messages`` (which only the honest-row sources leave unread): one pass, no
        fresh ``[..., B, d]`` tensor."""
        if self.reads_own_rows:
            raise ValueError("bit_flip.write_from: source 'own' reads the rows it would overwrite")
        flipped = self._flipped(messages, context).to(messages.dtype)
        torch.mul(flipped.expand(rows.shape), -self.scale, out=rows)

    def _flipped(self, messages: Tensor, context: AttackContext) -> Tensor:
        """The vector(s) sent negated: ``[..., 1, d]``, or ``[..., B, d]`` for ``"own"``."""
        if self.source == "own":
            return own_rows(messages, context)
        if self.source == "client_model" and context.kind == "cross_gradient":
            return self._client_model_gradient(messages, context)
        if self.source in ("client", "client_model"):
            return client_row(messages, context, self.client)
        return honest_mean(messages, context)

    def _client_model_gradient(self, messages: Tensor, context: AttackContext) -> Tensor:
        """``g_c(x_c)`` as a ``[1, d]`` row, from the defense's ``client_gradient``."""
        gradient = context.defense_state.get("client_gradient")
        if gradient is None:
            raise ValueError(
                "bit_flip.source 'client_model' on cross gradients needs the defense to expose "
                "defense_state['client_gradient'] (Federated-Clustering does); use source 'client' instead"
            )
        return gradient(self.client).reshape(1, -1).to(messages.device)
