"""Attacks that ignore what they see: large gradient and constant (NaN/Inf/huge) rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attacks.base import register
from robust_pfl.types import AttackContext


def _require_number(attack: str, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{attack}.{field} must be a number, got {value!r}")


def _byzantine_shape(messages: Tensor, context: AttackContext) -> tuple[int, ...]:
    return (*messages.shape[:-2], int(context.byzantine.sum()), messages.shape[-1])


@register
@dataclass(frozen=True)
class LargeGradient:
    """Large-gradient attack: every coordinate i.i.d. ``N(mean, std^2)``; the official
    Fig. 6 code uses ``randn * 200 + 1e6``."""

    name = "large_gradient"
    summary = "i.i.d. N(mean, std^2) per coordinate (official Fig. 6: mean 1e6, std 200)"
    mean: float = 1e6
    std: float = 200.0

    def __post_init__(self) -> None:
        _require_number(self.name, "mean", self.mean)
        _require_number(self.name, "std", self.std)
        if not (self.std >= 0 and math.isfinite(self.std)):
            raise ValueError(f"large_gradient std must be finite and >= 0, got {self.std}")

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        rows = torch.empty(
            _byzantine_shape(messages, context), device=context.generator.device, dtype=messages.dtype
        )
        rows.normal_(self.mean, self.std, generator=context.generator)  # in place: no temporaries
        return rows.to(messages.device)


@register
@dataclass(frozen=True)
class ConstantValue:
    """Every Byzantine coordinate set to ``value`` (NaN, +-Inf, 1e38 ...): the
    conformance suite's hostile inputs."""

    name = "constant"
    summary = "every Byzantine coordinate equal to one value (nan, inf, 1e38, ...)"
    value: float = math.nan

    def __post_init__(self) -> None:
        _require_number(self.name, "value", self.value)

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return messages.new_full(_byzantine_shape(messages, context), self.value)
