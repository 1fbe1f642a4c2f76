"""Forged loss reports: choose the Byzantine clients' cluster, then poison it.

Loss-based clustered FL (IFCA, CLoVE, HypCluster) assigns a client to a model from the
losses the client *reports*; nothing verifies them.  An attacker that reports the
losses of the target cluster's honest clients is put in that cluster, and its model
(or gradient) messages then land in the target cluster's average.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal, Mapping, get_args

import torch
from pydantic import Field, field_validator
from torch import Tensor

from attacks._stats import byzantine_shape
from attacks.base import REGISTRY, NeedsBy, attack_options, build, register
from robust_pfl.engine.registry import did_you_mean
from robust_pfl.engine.types import AttackBase, AttackContext

Target = Literal["largest"]
TARGETS = get_args(Target)


@register
@attack_options
class ForgedLoss(AttackBase):
    """Forged loss reports that place every Byzantine client in the ``target``
    cluster, plus a ``payload`` attack on every other message.

    For ``"loss"`` messages (``[..., S, K]``: each sender's loss on each of the K
    models) every Byzantine row becomes the same forged report, built per leading
    block from the honest reports (rows of honest senders whose entries are all
    finite):

    * the target model ``t``: ``target`` itself (a model index), or ``"largest"``,
      the model that most honest reports rank lowest (ties: the lowest index);
    * the forged row is the mean of the honest reports whose lowest entry is at ``t``
      (the reports of the clients that choose ``t``).  A mean of rows whose minimum is
      at ``t`` has its minimum at ``t`` too, so a lowest-loss rule (IFCA) picks ``t``;
      and the row sits at the centre of those clients' loss vectors, so a clustering
      of the reports (CLoVE's k-means) puts it in their cluster, which the min-cost
      matching gives model ``t``.  A tie at ``t`` is broken by lowering entry ``t``
      just below the others (relative step ``1e-6``);
    * if no honest report ranks ``t`` lowest, the forged row is the honest mean with
      entry ``t`` set just below the lowest honest entry (IFCA then picks ``t``; a
      clustering may still put it elsewhere); with no finite honest report at all,
      ``1`` everywhere and ``0`` at ``t``.

    Every other kind (gradients, models, momenta ...) is delegated to the payload
    attack, ``attacks.build(payload, payload_options)``.  The default, ``"bit_flip"``
    (each Byzantine client sends minus its own honest vector: ``-x`` as a model,
    ``-g`` as a gradient), harms only the cluster it lands in, which is what forging
    chooses; ``"large_gradient"`` destroys whichever model it reaches wherever it
    lands, and the huge losses of that model then dominate every loss vector.  Loss
    reports are changed only because this class declares ``forges_losses = True``;
    the payload alone leaves them honest.

    Needs ``"omniscient"`` (it reads the honest loss reports) plus the payload's needs.
    """

    name: ClassVar[str] = "forged_loss"
    summary: ClassVar[str] = (
        "report the target cluster's honest losses (target model index or 'largest') so every Byzantine "
        "client joins that cluster; payload attack on the other messages"
    )
    needs = NeedsBy(
        frozenset({"omniscient", "adaptive"}),
        lambda self: frozenset({"omniscient"}) | frozenset(self.attack.needs),
    )
    forges_losses: ClassVar[bool] = True
    target: Annotated[
        Annotated[int, Field(ge=0)] | Target,
        Field(description="the model index the Byzantine clients join, or largest (most honest clients' choice)"),
    ] = "largest"
    payload: Annotated[str, Field(description="the registered attack sent on every other message")] = "bit_flip"
    payload_options: Annotated[
        Mapping[str, Any], Field(description="the payload attack's options")
    ] = dataclasses.field(default_factory=dict, hash=False)
    attack: Any = dataclasses.field(init=False, repr=False, compare=False)  # the payload attack, built

    @field_validator("payload")
    @classmethod
    def _registered(cls, payload: str) -> str:
        if payload not in REGISTRY or payload == cls.name:
            others = sorted(name for name in REGISTRY if name != cls.name)
            raise ValueError(
                f"must be a registered attack other than {cls.name!r} ({others}), got {payload!r}"
                f"{did_you_mean(payload, others)}"
            )
        return payload

    def __post_init__(self) -> None:
        try:
            attack = build(self.payload, dict(self.payload_options))
        except ValueError as error:
            raise ValueError(f"forged_loss.payload_options: {error}") from None
        if attack.poison is not None or "data" in frozenset(attack.needs):
            raise ValueError(
                f"forged_loss.payload must be a message attack; {self.payload!r} poisons training data "
                "(a data attack acts when the federation is built, not on delivered messages)"
            )
        object.__setattr__(self, "payload_options", dict(self.payload_options))
        object.__setattr__(self, "attack", attack)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        if context.kind != "loss":
            return self.attack(messages, context).to(messages.dtype)
        return self.forge(messages, context)

    def check_reported_models(self, models: int) -> None:
        if isinstance(self.target, int) and self.target >= models:
            raise ValueError(f"forged_loss.target = {self.target}, but the defense reports losses on {models} models")

    def forge(self, reports: Tensor, context: AttackContext) -> Tensor:
        """The Byzantine rows ``[..., B, K]`` of loss reports ``[..., S, K]``."""
        k = reports.shape[-1]
        self.check_reported_models(k)
        lead = reports.shape[:-2]
        flat = reports.reshape(-1, *reports.shape[-2:])
        honest = ~context.byzantine.to(reports.device)
        rows = torch.stack([self._forged_row(block[honest]) for block in flat.double()])  # loop over blocks
        out = rows.to(reports.dtype).reshape(*lead, 1, k)
        return out.expand(byzantine_shape(reports, context)).clone()

    def _forged_row(self, honest: Tensor) -> Tensor:
        """One forged report ``[K]`` (float64) from the honest reports ``[H, K]``."""
        k = honest.shape[-1]
        usable = honest[torch.isfinite(honest).all(-1)]
        if usable.shape[0] == 0:
            target = 0 if self.target == "largest" else int(self.target)
            row = torch.ones(k, dtype=torch.float64, device=honest.device)
            row[target] = 0.0
            return row
        lowest = usable.argmin(-1)
        if self.target == "largest":
            target = int(torch.bincount(lowest, minlength=k).argmax())
        else:
            target = int(self.target)
        choosing = usable[lowest == target]
        if choosing.shape[0] > 0:
            row = choosing.mean(0)
        else:
            row = usable.mean(0)
            row[target] = usable.min()
        return _strictly_lowest(row, target)


def _strictly_lowest(row: Tensor, target: int) -> Tensor:
    """``row`` with entry ``target`` lowered just below every other entry if it is not
    already the strict minimum (a relative step of ``1e-6``, at least ``1e-12``)."""
    if row.shape[0] < 2:
        return row
    others = torch.cat([row[:target], row[target + 1 :]]).min()
    if bool(row[target] < others):
        return row
    row = row.clone()
    row[target] = others - max(1e-6 * float(others.abs()), 1e-12)
    return row
