"""Backdoor attacks: BadNets, DBA and model replacement.

A backdoor attacker wants the federation's models to keep their clean accuracy but to
predict a chosen class ``target`` on any image that carries a *trigger*.  All three
attacks here are data attacks (``needs = {"data"}``): the composition root calls
:meth:`Backdoor.poison_samples` on the Byzantine clients' training data once (and on
every re-dealt split), and the Byzantine clients then train honestly on it;
:class:`ModelReplacement` additionally scales what it sends.

**Trigger.**  A ``size x size`` square of pixel intensity ``value`` at the image's
bottom-right corner, ``margin`` pixels from the right and bottom edges, on every
channel; the same definition for any image shape ``[C, H, W]`` (digits 1x8x8, MNIST
1x28x28, CIFAR 3x32x32).  It is defined in *pixel space* (images in ``[0, 1]``):
the engine's inputs are normalised, ``(pixel - mean) / std`` per channel, so a stamped
input pixel holds ``(value - mean_c) / std_c``, computed with the same float32
arithmetic as :func:`robust_pfl.engine.tasks.transforms.materialise`; stamping the
normalised input therefore gives bit for bit the normalised stamped image.  The corner
is that of the image as the client holds it (after its cluster's rotation).

**Attack success rate (ASR).**  For the honest clients' test images whose label is not
``target``, the fraction their model classifies as ``target`` once the *full* trigger
is stamped (:meth:`Backdoor.stamp_trigger`); the engine records it as
``attack_success_rate`` beside ``test_accuracy``.

References:

* Gu, Dolan-Gavitt, Garg, "BadNets: Identifying Vulnerabilities in the Machine Learning
  Model Supply Chain", 2017, Sec. 3 (attack model: a pixel pattern and a target label
  on training images) and Sec. 4.2 (single-pixel and square pattern backdoors at the
  bottom-right corner).
* Xie, Huang, Chen, Li, "DBA: Distributed Backdoor Attacks against Federated
  Learning", ICLR 2020, Sec. 2.2-2.3: the global trigger is split into local
  triggers, each adversarial party poisons with its own local one, and the attack is
  evaluated with the global trigger.
* Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To Backdoor Federated Learning",
  AISTATS 2020, Sec. 4.1-4.2 (Eq. 3): the attacker submits
  ``L = gamma (X - G) + G`` with ``gamma = n / eta`` so that averaging replaces the
  global model ``G`` with the backdoored ``X``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import honest_mean, own_rows
from attacks.base import attack_options, register
from robust_pfl.engine.types import AttackContext, BackdoorAttack

Size = Annotated[int, Field(ge=1, description="side of the square trigger, in pixels")]
Margin = Annotated[int, Field(ge=0, description="pixels between the trigger and the bottom and right edges")]
Value = Annotated[float, Field(ge=0, le=1, description="trigger pixel intensity in pixel space [0, 1], before normalisation")]
Target = Annotated[int, Field(ge=0, description="the class a triggered image should be classified as")]
Fraction = Annotated[
    float, Field(gt=0, le=1, description="share of each Byzantine client's training images that are triggered and relabelled")
]


class Backdoor(BackdoorAttack):
    """What the three backdoor attacks share: the trigger geometry, stamping, data
    poisoning and honest sending (the hooks of
    :class:`~robust_pfl.engine.types.BackdoorAttack`).  Subclasses declare the fields
    ``size``, ``margin``, ``value``, ``target`` and ``poison_fraction`` (and may
    override :meth:`part_masks`)."""

    # -- the trigger ----------------------------------------------------------------------
    def trigger_mask(self, height: int, width: int) -> Tensor:
        """``[H, W]`` bool: the full trigger's pixels (bottom-right square).

        Raises ``ValueError`` naming ``<attack>.size`` when the square and its margin do
        not fit in the image."""
        extent = self.size + self.margin
        if extent > height or extent > width:
            raise ValueError(
                f"{self.name}.size: a {self.size}x{self.size} trigger {self.margin} pixels from the edges needs "
                f"images of at least {extent}x{extent} pixels, got {height}x{width}"
            )
        mask = torch.zeros(height, width, dtype=torch.bool)
        mask[height - extent : height - self.margin, width - extent : width - self.margin] = True
        return mask

    def part_masks(self, height: int, width: int) -> Tensor:
        """``[P, H, W]`` bool: the trigger part of each Byzantine client (client ``i``
        in ``byzantine.nonzero()`` order stamps part ``i mod P``).  One part, the full
        trigger, unless a subclass splits it."""
        return self.trigger_mask(height, width).unsqueeze(0)

    def fill(self, stats: tuple[Tensor, Tensor] | None, channels: int, dtype: torch.dtype) -> Tensor:
        """``[C, 1, 1]``: the trigger's input value per channel, ``(value - mean) / std``
        in float32 as the task normalises its images (``stats = None``: the inputs are
        pixels)."""
        pixel = torch.full((channels, 1, 1), self.value, dtype=torch.float32)
        if stats is None:
            return pixel.to(dtype)
        mean, std = stats
        return ((pixel - mean.cpu()) / std.cpu()).to(dtype)

    def stamp(self, inputs: Tensor, mask: Tensor, stats: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``inputs[..., C, H, W]`` (normalised by ``stats``) with the pixels of
        ``mask[..., H, W]`` (broadcast over the leading dimensions) set to the trigger's
        value.  Returns a new tensor."""
        fill = self.fill(stats, inputs.shape[-3], inputs.dtype).to(inputs.device)
        return torch.where(mask.to(inputs.device).unsqueeze(-3), fill, inputs)

    def stamp_trigger(self, inputs: Tensor, stats: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``inputs[..., C, H, W]`` with the full trigger stamped on every image (what
        the attack success rate is measured on)."""
        return self.stamp(inputs, self.trigger_mask(*inputs.shape[-2:]), stats)

    # -- data poisoning -------------------------------------------------------------------
    def check_target(self, num_classes: int) -> None:
        """Raise ``ValueError`` naming ``<attack>.target`` unless it is one of the
        task's classes."""
        if self.target >= num_classes:
            raise ValueError(f"{self.name}.target must be a class in [0, {num_classes}), got {self.target}")

    def poison_samples(
        self,
        inputs: Tensor,
        targets: Tensor,
        num_classes: int,
        stats: tuple[Tensor, Tensor] | None,
        generator: torch.Generator,
    ) -> tuple[Tensor, Tensor]:
        """The Byzantine clients' training data after poisoning (new tensors).

        Args:
            inputs: ``[B, n, C, H, W]`` the Byzantine clients' normalised images, in
                ``byzantine.nonzero()`` order.
            targets: ``[B, n]`` their labels.
            num_classes: the task's classes (``target`` must be one).
            stats: ``(mean, std)`` ``[C, 1, 1]`` of the task's normalisation (``None``:
                inputs are pixels).
            generator: a CPU generator choosing the poisoned images.

        Each client has ``round(poison_fraction * n)`` of its images, chosen uniformly
        at random, stamped with its trigger part and relabelled ``target`` (BadNets
        Sec. 3; DBA Sec. 2.3).  One draw and one ``where`` for all clients.
        """
        self.check_target(num_classes)
        if inputs.dim() < 4:
            raise ValueError(f"{self.name} stamps images: inputs must be [B, n, C, H, W], got {tuple(inputs.shape)}")
        clients, samples = targets.shape[:2]
        chosen = round(self.poison_fraction * samples)
        keys = torch.rand(clients, samples, generator=generator)
        picked = torch.zeros(clients, samples, dtype=torch.bool)
        picked.scatter_(1, keys.argsort(dim=1)[:, :chosen], True)
        parts = self.part_masks(*inputs.shape[-2:])
        own = parts[torch.arange(clients) % parts.shape[0]]  # [B, H, W]: each client's part
        mask = own.unsqueeze(1) & picked[:, :, None, None]  # [B, n, H, W]
        stamped = self.stamp(inputs, mask, stats)
        picked = picked.to(targets.device)
        labels = torch.where(picked, torch.full_like(targets, self.target), targets)
        return stamped, labels

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        """The Byzantine clients send what honest training on their poisoned data gives."""
        return own_rows(messages, context)


@register
@attack_options
class BadNets(Backdoor):
    """BadNets (Gu et al. 2017, Sec. 3 and 4.2) in federated form: each Byzantine
    client stamps a bottom-right square trigger on ``poison_fraction`` of its training
    images, relabels them ``target`` and trains honestly (see the module docstring)."""

    name: ClassVar[str] = "badnets"
    summary: ClassVar[str] = "backdoor: bottom-right square trigger on a share of Byzantine images, labelled target"
    size: Size = 3
    margin: Margin = 0
    value: Value = 1.0
    target: Target = 0
    poison_fraction: Fraction = 0.5


@register
@attack_options
class DBA(Backdoor):
    """Distributed backdoor attack (Xie et al., ICLR 2020, Sec. 2.2-2.3): the square
    trigger's rows are split into ``parts`` horizontal bars (as even as possible, the
    local triggers of the paper's Fig. 1 are bars); Byzantine client ``i`` (in
    ``byzantine.nonzero()`` order) poisons with bar ``i mod parts`` only, and the
    success rate is measured with the full trigger."""

    name: ClassVar[str] = "dba"
    summary: ClassVar[str] = "distributed backdoor: client i stamps bar i mod parts of the square trigger; ASR on the full one"
    size: Size = 4
    margin: Margin = 0
    value: Value = 1.0
    target: Target = 0
    poison_fraction: Fraction = 0.5
    parts: Annotated[int, Field(ge=1, description="local triggers the square is split into (horizontal bars)")] = 4

    def __post_init__(self) -> None:
        if self.parts > self.size:
            raise ValueError(f"dba.parts must be <= dba.size ({self.size} rows to split into bars), got {self.parts}")

    def part_masks(self, height: int, width: int) -> Tensor:
        """``[parts, H, W]``: the full trigger's rows split into ``parts`` contiguous
        bars; disjoint, their union is :meth:`trigger_mask`."""
        full = self.trigger_mask(height, width)
        rows = torch.arange(height)
        top = height - self.size - self.margin
        bar = torch.div((rows - top).clamp(0, self.size - 1) * self.parts, self.size, rounding_mode="floor")
        return full.unsqueeze(0) & (bar.view(1, -1, 1) == torch.arange(self.parts).view(-1, 1, 1))


@register
@attack_options
class ModelReplacement(Backdoor):
    """Model replacement (Bagdasaryan et al., AISTATS 2020, Sec. 4.2, Eq. 3): the
    Byzantine clients train on BadNets-poisoned data and send their update scaled by
    ``boost`` (``gamma``), so that the server's average moves by about their
    backdoored update.

    Gradient-like messages (``gradient``, ``momentum``, ``cross_gradient``) are
    updates: the sent row is ``boost * own``.  ``model`` messages are ``G + boost (X -
    G)`` (Eq. 3) with ``G``, the model the round started from, estimated by the honest
    senders' mean (the attacker of the paper knows ``G``; the context does not carry
    it).  ``boost = None`` (default) is ``S / B`` (senders over Byzantine senders of
    the delivery): the paper's ``n / eta`` with server rate ``eta = 1``, shared by the
    ``B`` attackers, so that a mean over ``S`` rows gains the Byzantine clients'
    average update in full.
    """

    name: ClassVar[str] = "model_replacement"
    summary: ClassVar[str] = "backdoor: BadNets-poisoned update scaled by boost (default senders / Byzantine)"
    size: Size = 3
    margin: Margin = 0
    value: Value = 1.0
    target: Target = 0
    poison_fraction: Fraction = 0.5
    boost: Annotated[
        float | None, Field(gt=0, description="scale gamma of the sent update (None: senders / Byzantine senders)")
    ] = None

    def gamma(self, context: AttackContext) -> float:
        """The scale of this delivery: ``boost``, or ``S / B``."""
        if self.boost is not None:
            return float(self.boost)
        return context.byzantine.numel() / max(1, int(context.byzantine.sum()))

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        own = own_rows(messages, context)
        gamma = self.gamma(context)
        if context.kind == "model":
            start = honest_mean(messages, context)
            return start + gamma * (own - start)
        return own * gamma
