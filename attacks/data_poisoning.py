"""Label flip: the Byzantine clients train honestly on poisoned labels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from attacks._stats import own_rows
from attacks.base import register, require_choice, require_int
from robust_pfl.types import AttackBase, AttackContext

MODES = ("reverse", "shift", "pair")


@register
@dataclass(frozen=True)
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
    mode: str = "reverse"
    shift: int = 1
    source: int | None = None
    target: int | None = None

    def __post_init__(self) -> None:
        require_choice(self.name, "mode", self.mode, MODES)
        require_int(self.name, "shift", self.shift)
        for field in ("source", "target"):
            value = getattr(self, field)
            if self.mode == "pair" and value is None:
                raise ValueError(f"{self.name}.{field} is required with mode 'pair' (an integer class >= 0)")
            if value is not None:
                require_int(self.name, field, value, low=0)

    def poison(self, targets: Tensor, num_classes: int) -> Tensor:
        """New integer labels (any shape, same dtype and device as ``targets``).

        Raises ``ValueError`` unless ``targets`` are integer labels in
        ``[0, num_classes)`` (and, for ``"pair"``, ``source``/``target`` < ``C``).
        """
        require_int(self.name, "num_classes", num_classes, low=1)
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
