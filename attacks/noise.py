"""Gaussian noise: random rows, around zero or around the attacker's own gradient."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

from pydantic import Field
from torch import Tensor

from attacks._stats import fill_normal, normal_rows, own_rows
from attacks.base import attack_options, register
from robust_pfl.engine.types import AttackBase, AttackContext

Around = Literal["zero", "own"]
AROUND = get_args(Around)


@register
@attack_options
class GaussianNoise(AttackBase):
    """Gaussian-noise attack (the standard baseline of e.g. Blanchard et al., 2017,
    and Xie et al., 2018): every Byzantine coordinate i.i.d. ``N(0, std^2)``
    (``around="zero"``) or the client's own honest row plus that noise
    (``around="own"``).  All draws come from ``context.generator``."""

    name: ClassVar[str] = "gaussian_noise"
    summary: ClassVar[str] = "i.i.d. N(0, std^2) per coordinate, around zero or the own honest row"
    needs: ClassVar[frozenset[str]] = frozenset()
    iid_rows: ClassVar[bool] = True  # around zero; noise around the own row reads the messages
    std: Annotated[float, Field(ge=0, description="standard deviation of the noise")] = 200.0
    around: Annotated[
        Around, Field(description="zero: noise alone; own: the client's own honest row plus noise")
    ] = "zero"

    @property
    def reads_messages(self) -> bool:
        """Only noise around the own row reads the messages."""
        return self.around == "own"

    def __call__(self, messages: Tensor, context: AttackContext) -> Tensor:
        noise = normal_rows(messages, context, 0.0, self.std)
        return noise.add_(own_rows(messages, context)) if self.around == "own" else noise

    def write_rows(self, rows: Tensor, context: AttackContext) -> None:
        """The rows of :meth:`__call__` drawn in place (only valid when
        :attr:`reads_messages` is false: noise around zero)."""
        if self.reads_messages:
            raise ValueError("gaussian_noise.around='own' reads the messages: call the attack instead")
        fill_normal(rows, context.generator, 0.0, self.std)
