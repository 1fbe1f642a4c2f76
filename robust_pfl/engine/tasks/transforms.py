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


def materialise(
    images: Tensor,
    labels: Tensor,
    index: Tensor,
    turns: Tensor,
    shift: Tensor,
    num_classes: int,
    stats: tuple[Tensor, Tensor],
    dtype: torch.dtype,
) -> ClientData:
    """Stacked client data: ``inputs[N, n, C, H, W]`` = normalised, rotated
    ``images[index]``; ``targets[N, n]`` = ``(labels[index] + shift) mod C``."""
    mean, std = stats
    inputs = (rotate(images[index], turns) - mean) / std
    targets = (labels[index] + shift.view(-1, 1)) % num_classes
    return ClientData(inputs.to(dtype), targets)
