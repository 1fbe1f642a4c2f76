"""Reused per-round memory for algorithms: the ``[N, d]`` gradient and delivery
buffers, each round's local-training start, and the local steps of IFCA Option II,
HypCluster, CFL and CLoVE that run through them."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from defenses.optimiser import HeavyBall
from robust_pfl.engine.data import Batch
from robust_pfl.engine.devices import same_device
from robust_pfl.engine.federation import Federation


def run_local_steps(
    federation: Federation,
    local: Tensor,
    batch: Batch,
    optimizer: Any,
    steps: int,
    buffers: "RoundBuffers | None" = None,
) -> Tensor:
    """``steps`` local optimiser steps on every row of ``local``, in place: the first
    on ``batch``, each further one on a fresh batch (IFCA Option II's local SGD, also
    HypCluster's, CFL's and CLoVE's).  ``optimizer`` has ``apply(params, update)``
    (:class:`HeavyBall`, or CLoVE's Adam).  Returns the first step's honest gradients
    (with ``buffers``: in its reused slot ``"first"``, the later steps' in ``"later"``)."""

    def gradients(at: Batch, slot: str) -> Tensor:
        out = None if buffers is None else buffers.scratch(slot, tuple(local.shape), local)
        return federation.gradients(local, at, out=out)

    first = gradients(batch, "first")
    optimizer.apply(local, first)
    for _ in range(steps - 1):
        optimizer.apply(local, gradients(federation.sample_batch(), "later"))
    return first


class LocalStart:
    """Each round's local training start, in reused memory: the rows of the picked
    models (``models[index]``) and a heavy-ball optimiser whose momentum restarts at
    zero (IFCA Option II, HypCluster, CLoVE).  Bit for bit what a fresh copy and a
    fresh :class:`HeavyBall` give; checkpoints leave the buffers out."""

    def __init__(self) -> None:
        self.buffers = RoundBuffers()
        self._optimizer: HeavyBall | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"buffers": RoundBuffers(), "_optimizer": None}

    def rows(self, models: Tensor, index: Tensor) -> Tensor:
        return self.buffers.gather(models, index, "local")

    def optimizer(self, lr: float, momentum: float, local: Tensor) -> HeavyBall:
        kept = self._optimizer
        if kept is None or not kept.fits(lr, momentum, local):
            kept = self._optimizer = HeavyBall(lr, momentum, local)
        else:
            kept.restart()
        return kept


class RoundBuffers:
    """An algorithm's ``[N, d]`` gradient and delivery buffers, reused every round (a
    fresh tensor per round costs its page faults), and the round's gradients through
    them.  Left out of checkpoints: every round overwrites them before reading."""

    gathered: dict[str, Tensor] | None = None  # a class default: checkpoints that predate it load too

    def __init__(self) -> None:
        self.gradients: Tensor | None = None
        self.delivered: Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"gradients": None, "delivered": None, "gathered": None}

    def gather(self, source: Tensor, index: Tensor, slot: str = "models") -> Tensor:
        """``source[index]`` (rows) into the reused buffer ``slot``, e.g. each client's
        cluster model; valid until the next call with that slot."""
        buffer = self.scratch(slot, (index.shape[0], *source.shape[1:]), source)
        return torch.index_select(source, 0, index, out=buffer)

    def scratch(self, slot: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """An uninitialised tensor of ``shape`` (``like``'s dtype and device), the same
        memory on every call with this ``slot`` and shape."""
        if self.gathered is None:
            self.gathered = {}
        buffer = self.gathered.get(slot)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or not same_device(buffer.device, like.device):
            buffer = self.gathered[slot] = like.new_empty(shape)
        return buffer

    def _shaped(self, like: Tensor) -> tuple[Tensor, Tensor]:
        if self.gradients is None or self.gradients.shape != like.shape or self.gradients.dtype != like.dtype:
            self.gradients, self.delivered = torch.empty_like(like), torch.empty_like(like)
        return self.gradients, self.delivered

    def own_gradients(self, federation: Federation, params: Tensor, batch: Batch) -> Tensor:
        """``g_i(x_i)`` for every row of ``params`` into the reused buffer."""
        return federation.gradients(params, batch, out=self._shaped(params)[0])

    def delivered_gradients(
        self,
        federation: Federation,
        params: Tensor,
        batch: Batch,
        round_index: int,
        defense_state: Mapping[str, Any] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(gradients, received)``: every client's ``g_i(x_i)`` and the messages the
        server receives.  When the attack does not read messages, the Byzantine
        senders' gradients are not computed and the attack writes its rows into the
        gradient buffer itself (so those rows of ``gradients`` are what they sent, as
        :class:`~robust_pfl.engine.types.RoundRecord` allows); otherwise the delivery goes to
        the second buffer and ``gradients`` stay honest."""
        grads, delivered = self._shaped(params)
        federation.gradients(params, batch, out=grads, skip_unread=True)
        if federation.byzantine_rows_read:
            received = federation.deliver(grads, round_index, "gradient", defense_state=defense_state, out=delivered)
        else:
            received = federation.deliver(grads, round_index, "gradient", defense_state=defense_state, inplace=True)
        return grads, received
