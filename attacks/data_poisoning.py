"""Label flip: the Byzantine clients train honestly on poisoned labels."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

import torch
from pydantic import Field
from torch import Tensor

from attacks._stats import own_rows
from attacks.base import attack_options, register
from robust_pfl.engine.types import AttackBase, AttackContext

Mode = Literal["reverse", "shift", "pair"]
MODES = get_args(Mode)


@register
@attack_options
class LabelFlip(AttackBase):
    """Label-flipping data poisoning (the classic ``y -> C - 1 - y``, i.e. ``9 - y`` on
    MNIST, as in Fang et al., USENIX Security 2020).

    :meth:`poison` maps a Byzantine client's training labels (``C`` classes):

    * ``"reverse"`` (default): ``y -> C - 1 - y``;
    * ``"shift"``: ``y -> (y + shift) mod C`` (the private-label shift);
    * ``"pair"``: only ``source -> target``; every other label is kept.

    The composition root applies :meth:`poison` to the Byzantine clients' training
    targets once, at construction; afterwards the Byzantine clients send the honest
    gradients of their poisoned data, so :meth:`__call__` returns their own rows
    unchanged.
    """

    name: ClassVar[str] = "label_flip"
    summary: ClassVar[str] = "poison Byzantine training labels: reverse C-1-y, shift (y+k) mod C, or one pair"
    needs: ClassVar[frozenset[str]] = frozenset({"data"})
    mode: Annotated[
        Mode, Field(description="reverse: C-1-y | shift: (y + shift) mod C | pair: source -> target")
    ] = "reverse"
    shift: Annotated[int, Field(description="the label shift of mode shift")] = 1
    source: Annotated[int | None, Field(ge=0, description="the class relabelled in mode pair (required there)")] = None
    target: Annotated[int | None, Field(ge=0, description="its new label in mode pair (required there)")] = None

    def __post_init__(self) -> None:
        for field in ("source", "target"):
            if self.mode == "pair" and getattr(self, field) is None:
                raise ValueError(f"{self.name}.{field} is required with mode 'pair' (an integer class >= 0)")

    def poison(self, targets: Tensor, num_classes: int) -> Tensor:
        """New integer labels (any shape, same dtype and device as ``targets``).

        Raises ``ValueError`` unless ``targets`` are integer labels in
        ``[0, num_classes)`` (and, for ``"pair"``, ``source``/``target`` < ``C``).
        """
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"{self.name}: num_classes must be an integer >= 1, got {num_classes!r}")
        if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
            raise ValueError(f"{self.name}: targets must be integer class labels, got dtype {targets.dtype}")
        if targets.numel() and bool(((targets < 0) | (targets >= num_classes)).any()):
            low, high = int(targets.min()), int(targets.max())
            raise ValueError(
                f"{self.name}: labels must lie in [0, {num_classes}), got values in [{low}, {high}]"
            )
        if self.mode == "reverse":
            return (num_classes - 1) - targets
        if self.mode == "shift":
            return torch.remainder(targets + self.shift, num_classes)
        for field in ("source", "target"):
            if getattr(self, field) >= num_classes:
                raise ValueError(
                    f"{self.name}.{field} must be a class in [0, {num_classes}), got {getattr(self, field)}"
                )
        return torch.where(targets == self.source, torch.full_like(targets, self.target), targets)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return own_rows(messages, context)
