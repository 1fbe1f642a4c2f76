"""Attacks that ignore what they see: large gradient, constant (NaN/Inf/huge) and +inf rows."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

from pydantic import Field
import torch
from torch import Tensor

from attacks._stats import byzantine_shape, fill_normal, normal_rows
from attacks.base import attack_options, register
from robust_pfl.engine.types import AttackBase, AttackContext


@register
@attack_options
class LargeGradient(AttackBase):
    """Large-gradient attack: every coordinate i.i.d. ``N(mean, std^2)``; the official
    Fig. 6 code uses ``randn * 200 + 1e6``."""

    name: ClassVar[str] = "large_gradient"
    summary: ClassVar[str] = "i.i.d. N(mean, std^2) per coordinate (official Fig. 6: mean 1e6, std 200)"
    needs: ClassVar[frozenset[str]] = frozenset()
    reads_messages: ClassVar[bool] = False
    iid_rows: ClassVar[bool] = True  # rows drawn apart: see attack_draws_rows_apart
    mean: Annotated[float, Field(allow_inf_nan=True, description="mean of every coordinate")] = 1e6
    std: Annotated[float, Field(ge=0, description="standard deviation of every coordinate")] = 200.0

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return normal_rows(messages, context, self.mean, self.std)

    def write_rows(self, rows: Tensor, context: AttackContext) -> None:
        """The rows of :meth:`__call__`, drawn in place into ``rows[..., B, d]``."""
        fill_normal(rows, context.generator, self.mean, self.std)


@register
@attack_options
class ConstantValue(AttackBase):
    """Every Byzantine coordinate set to ``value`` (NaN, +-Inf, 1e38 ...): the
    conformance suite's hostile inputs."""

    name: ClassVar[str] = "constant"
    summary: ClassVar[str] = "every Byzantine coordinate equal to one value (nan, inf, 1e38, ...)"
    needs: ClassVar[frozenset[str]] = frozenset()
    reads_messages: ClassVar[bool] = False
    iid_rows: ClassVar[bool] = True  # rows drawn apart: see attack_draws_rows_apart
    value: Annotated[
        float, Field(allow_inf_nan=True, description="every coordinate's value (nan and inf allowed)")
    ] = math.nan

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return messages.new_full(byzantine_shape(messages, context), self.value_in(messages.dtype))

    def write_rows(self, rows: Tensor, context: AttackContext) -> None:
        """The rows of :meth:`__call__`, written in place into ``rows[..., B, d]``."""
        rows.fill_(self.value_in(rows.dtype))

    def value_in(self, dtype: torch.dtype) -> float:
        """``value`` rounded to ``dtype`` as a cast rounds it: past the dtype's range it
        is +-inf (``fill_`` refuses such a number outright)."""
        return float(torch.tensor(self.value, dtype=torch.float64).to(dtype))


@register
@attack_options
class Inf(AttackBase):
    """ByzFL's Inf attack (Gonzalez, Guerraoui, Pinot, Rizk, Stephan & Taiani, "ByzFL:
    research framework for robust federated learning", arXiv 2025; ``Inf`` in its
    attacks module): every Byzantine coordinate is ``+inf``, the crudest test of
    whether a defense drops non-finite rows.  Same rows as ``constant(value=inf)``,
    under ByzFL's name and without options."""

    name: ClassVar[str] = "inf"
    summary: ClassVar[str] = "every Byzantine coordinate +inf (ByzFL's Inf attack)"
    needs: ClassVar[frozenset[str]] = frozenset()
    reads_messages: ClassVar[bool] = False
    iid_rows: ClassVar[bool] = True  # one constant: see attack_draws_rows_apart

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        return messages.new_full(byzantine_shape(messages, context), math.inf)

    def write_rows(self, rows: Tensor, context: AttackContext) -> None:
        """The rows of :meth:`__call__`, written in place into ``rows[..., B, d]``."""
        rows.fill_(math.inf)
