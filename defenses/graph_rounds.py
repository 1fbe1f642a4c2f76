"""Message delivery on a communication graph (decentralised systems).

Every honest client broadcasts one message to all its neighbours; a Byzantine node may
send each neighbour a different message.  Both go through the federation's one
injection point, :meth:`robust_pfl.engine.federation.Federation.deliver`: the attack sees the
honest broadcast once per receiver (``context.receivers`` names them) and returns the
Byzantine rows for each receiver.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch
from torch import Tensor

from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import MessageKind


def received_from_neighbours(
    federation: Federation,
    broadcast: Tensor,
    round_index: int,
    kind: MessageKind,
    receivers: Tensor,
    defense_state: Mapping[str, Any] | None = None,
    out: Tensor | None = None,
    byzantine_only: bool = False,
    needed: Tensor | None = None,
) -> Tensor:
    """``[R, N, d]``: what each receiver in ``receivers[R]`` gets from every client.

    Row ``j`` is ``broadcast[j]`` for an honest ``j`` and the attack's row for receiver
    ``r`` for a Byzantine ``j``.  Rows of clients that are not ``r``'s neighbours are
    meaningless: callers mask them with the graph's adjacency.  The result holds
    ``R N d`` values: chunk the receivers (:func:`receiver_chunks`) for large models.
    With ``out`` (``[R, N, d]``, reused by the caller) and an attack, the broadcast is
    copied there and the attack writes its rows in place: no fresh tensor per call, the
    same values (without an attack the result is the broadcast's view, as without
    ``out``).
    With ``byzantine_only`` only the Byzantine rows, ``[R, B, d]`` (their broadcast rows
    without an attack), for callers that take the honest rows from ``broadcast``; with
    ``needed[R, B]`` as well, only the rows each receiver reads, ``[P, d]`` in the
    order of ``needed.nonzero()`` (see :meth:`Federation.deliver`).
    """
    received = broadcast.unsqueeze(0).expand(receivers.numel(), *broadcast.shape)
    byzantine = federation.byzantine
    if not byzantine_only and (federation.attack is None or not bool(byzantine.any())):
        return received
    if byzantine_only or out is not None:
        return federation.deliver(
            received if out is None else out.copy_(received),
            round_index,
            kind,
            receivers=receivers,
            defense_state=defense_state,
            inplace=out is not None,
            byzantine_only=byzantine_only,
            needed=needed,
        )
    rows = federation.deliver(
        received, round_index, kind, receivers=receivers, defense_state=defense_state, byzantine_only=True
    )
    received = received.clone()
    received[:, byzantine] = rows
    return received


def receiver_chunks(
    clients: int, dimension: int, budget_mb: float, itemsize: int = 4, rows: int | None = None
) -> Iterator[Tensor]:
    """Receiver index chunks whose ``[R, rows, d]`` received messages fit ``budget_mb``
    (``rows``: what each receiver gets, default every client's row)."""
    per_receiver = max(1, (clients if rows is None else rows) * dimension * itemsize)
    size = max(1, int(budget_mb * 2**20) // per_receiver)
    for start in range(0, clients, size):
        yield torch.arange(start, min(start + size, clients))
