"""What makes an image task's clusters differ: rotations, label maps, normalisation.

A client's split is described by source indices ``index[N, n]`` plus its cluster's
transform: ``turns[N, n]`` quarter turns (``torch.rot90`` on the H, W dimensions,
counter-clockwise; per sample, so a client may mix rotations) and a label shift
``shift[N]`` (label ``y -> (y + shift) mod C``).  :func:`materialise` gathers, rotates,
normalises and relabels in a few tensor operations: one masked ``rot90`` per distinct
turn count (at most 3), never a loop over clients.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from robust_pfl.engine.data import ClientData

Normalization = Literal["none", "mnist", "per_channel"]
NORMALIZATIONS: tuple[str, ...] = ("none", "mnist", "per_channel")
#: The official code's MNIST normalisation (torchvision's usual constants).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def normalization_stats(mode: Normalization, train_images: Tensor) -> tuple[Tensor, Tensor]:
    """``(mean, std)``, each ``[C, 1, 1]``, of normalisation ``mode``.

    ``"none"``: 0 and 1; ``"mnist"``: 0.1307 and 0.3081 on every channel;
    ``"per_channel"``: the mean and (population) standard deviation of each channel
    over the source train split ``train_images[M, C, H, W]`` (rotations do not change
    them, so every cluster shares one normalisation).
    """
    channels = train_images.shape[1]
    if mode == "none":
        mean, std = torch.zeros(channels), torch.ones(channels)
    elif mode == "mnist":
        mean, std = torch.full((channels,), MNIST_MEAN), torch.full((channels,), MNIST_STD)
    elif mode == "per_channel":
        variance, mean = torch.var_mean(train_images, dim=(0, 2, 3), correction=0)
        std = variance.sqrt().clamp_min(1e-8)
    else:
        raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}, got {mode!r}")
    return mean.view(-1, 1, 1), std.view(-1, 1, 1)


def rotate(images: Tensor, turns: Tensor) -> Tensor:
    """``images[..., C, H, W]`` with sample ``s`` rotated by ``turns[s] * 90`` degrees
    (``torch.rot90`` on the last two dimensions; ``turns`` has the leading shape and is
    taken mod 4).  Returns a new tensor."""
    out = images.clone()
    turns = turns % 4
    for quarter in (1, 2, 3):
        mask = turns == quarter
        if mask.any():
            out[mask] = torch.rot90(images[mask], quarter, dims=(-2, -1))
    return out


#: Largest stack of normalised turned images :class:`PreparedImages` keeps (bytes).
PREPARED_LIMIT_BYTES = 2 << 30


class PreparedImages:
    """The source images normalised once for each quarter turn in ``quarters``, so
    that a split is one gather.  A task that re-deals its train split every epoch (the
    official code re-deals MNIST) would otherwise rotate and normalise every sample
    again at each epoch: a step several times the others' length
    (benchmarks/README.md, "The epoch re-deal").  Rotation is a permutation and the
    normalisation elementwise, so the gathered values equal :func:`materialise`'s
    bit for bit."""

    def __init__(self, images: Tensor, stats: tuple[Tensor, Tensor], quarters: list[int]) -> None:
        mean, std = stats
        self.quarters = sorted({quarter % 4 for quarter in quarters})
        self.images = images
        self.stats = stats
        slot = torch.full((4,), -1, dtype=torch.long)
        slot[self.quarters] = torch.arange(len(self.quarters))
        self._slot = slot
        self._stacked = torch.stack(
            [(torch.rot90(images, quarter, dims=(-2, -1)) - mean) / std for quarter in self.quarters]
        )

    @classmethod
    def fits(cls, images: Tensor, quarters: list[int]) -> bool:
        """Whether the stack for ``quarters`` stays within :data:`PREPARED_LIMIT_BYTES`."""
        return len({q % 4 for q in quarters}) * images.numel() * images.element_size() <= PREPARED_LIMIT_BYTES

    def serves(self, images: Tensor, stats: tuple[Tensor, Tensor], turns: Tensor) -> bool:
        """Whether these are ``images`` normalised by ``stats`` at every one of ``turns``."""
        same_stats = all(torch.equal(a, b) for a, b in zip(stats, self.stats))
        return images is self.images and same_stats and bool((self._slot[turns % 4] >= 0).all())

    def gather(self, index: Tensor, turns: Tensor, out: Tensor | None = None) -> Tensor:
        """``[N, n, C, H, W]``: the normalised ``images[index]``, each turned by ``turns``
        (into ``out`` when it has that shape and dtype: a fresh result of this size
        page-faults, several times the gather's own cost)."""
        flat = self._stacked.view(-1, *self._stacked.shape[2:])
        rows = (self._slot[turns % 4] * self._stacked.shape[1] + index).reshape(-1)
        shape = (*index.shape, *flat.shape[1:])
        if out is not None and tuple(out.shape) == shape and out.dtype == flat.dtype and out.is_contiguous():
            torch.index_select(flat, 0, rows, out=out.view(-1, *flat.shape[1:]))
            return out
        return torch.index_select(flat, 0, rows).view(shape)


def materialise(
    images: Tensor,
    labels: Tensor,
    index: Tensor,
    turns: Tensor,
    shift: Tensor,
    num_classes: int,
    stats: tuple[Tensor, Tensor],
    dtype: torch.dtype,
    prepared: PreparedImages | None = None,
    out: Tensor | None = None,
) -> ClientData:
    """Stacked client data: ``inputs[N, n, C, H, W]`` = normalised, rotated
    ``images[index]``; ``targets[N, n]`` = ``(labels[index] + shift) mod C``.
    ``prepared``: the same images normalised at each turn beforehand (one gather,
    into ``out`` when it fits); used when it serves these images, statistics and turns."""
    if prepared is not None and prepared.serves(images, stats, turns):
        inputs = prepared.gather(index, turns, out)
    else:
        mean, std = stats
        inputs = (rotate(images[index], turns) - mean) / std
    return ClientData(inputs.to(dtype), relabel(labels, index, shift, num_classes))


def relabel(labels: Tensor, index: Tensor, shift: Tensor, num_classes: int) -> Tensor:
    """``targets[N, n]`` = ``(labels[index] + shift) mod C`` (``shift[N]`` per client)."""
    return (labels[index] + shift.view(-1, 1)) % num_classes
