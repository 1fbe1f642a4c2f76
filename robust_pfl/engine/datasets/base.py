"""The loaded form of every image data set, its error type and shared validation.

Every loader returns a :class:`LabelledImages`: float32 images in ``[0, 1]`` shaped
``[n, C, H, W]`` and int64 labels ``[n]`` for a train and a test split.  Every problem
with the files on disk is reported as a :class:`DatasetError` whose message names the
file and what was expected against what was found.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor


class DatasetError(ValueError):
    """A data set is missing, malformed, or cannot be loaded as asked."""


@dataclass(frozen=True)
class LabelledImages:
    """A labelled image data set split into train and test.

    Attributes:
        train_images: ``[n_train, C, H, W]`` float32 in ``[0, 1]``.
        train_labels: ``[n_train]`` int64 in ``[0, num_classes)``.
        test_images: ``[n_test, C, H, W]`` float32 in ``[0, 1]``.
        test_labels: ``[n_test]`` int64 in ``[0, num_classes)``.
        num_classes: number of classes.
        name: the data set's name (a key of :data:`robust_pfl.engine.datasets.DATASETS`, or a
            variant of one such as ``"cifar100_coarse"``).
    """

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images: Tensor = getattr(self, f"{split}_images")
            labels: Tensor = getattr(self, f"{split}_labels")
            if images.dtype != torch.float32 or images.dim() != 4:
                raise DatasetError(
                    f"{self.name} {split} images: expected a float32 [n, C, H, W] tensor, "
                    f"found {images.dtype} with shape {list(images.shape)}"
                )
            if labels.dtype != torch.int64 or labels.dim() != 1:
                raise DatasetError(
                    f"{self.name} {split} labels: expected an int64 [n] tensor, "
                    f"found {labels.dtype} with shape {list(labels.shape)}"
                )
            if images.shape[0] != labels.shape[0]:
                raise DatasetError(
                    f"{self.name} {split}: {images.shape[0]} images but {labels.shape[0]} labels"
                )
        if self.train_images.shape[1:] != self.test_images.shape[1:]:
            raise DatasetError(
                f"{self.name}: train images are {list(self.train_images.shape[1:])} but test "
                f"images are {list(self.test_images.shape[1:])}"
            )

    @classmethod
    def from_arrays(
        cls,
        name: str,
        num_classes: int,
        train: tuple[np.ndarray, np.ndarray],
        test: tuple[np.ndarray, np.ndarray],
        *,
        max_value: float = 255.0,
    ) -> "LabelledImages":
        """Build from numpy ``(images [n, C, H, W], labels [n])`` pairs.

        Images are divided by ``max_value`` (255 for bytes, 16 for the 8x8 digits) into
        float32 ``[0, 1]``; labels become int64.  The arrays are copied.
        """
        return cls(
            train_images=_unit_images(train[0], max_value),
            train_labels=torch.from_numpy(np.asarray(train[1]).astype(np.int64)),
            test_images=_unit_images(test[0], max_value),
            test_labels=torch.from_numpy(np.asarray(test[1]).astype(np.int64)),
            num_classes=num_classes,
            name=name,
        )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        channels, height, width = self.train_images.shape[1:]
        return (channels, height, width)

    @property
    def num_features(self) -> int:
        """``C * H * W``: the length of a flattened image."""
        channels, height, width = self.image_shape
        return channels * height * width

    @property
    def num_train(self) -> int:
        return self.train_images.shape[0]

    @property
    def num_test(self) -> int:
        return self.test_images.shape[0]


def _unit_images(images: np.ndarray, max_value: float) -> Tensor:
    scaled = np.asarray(images).astype(np.float32)  # a writable copy
    scaled /= np.float32(max_value)
    return torch.from_numpy(scaled)


def check_counts(
    n_images: int, n_labels: int, images_source: str | Path, labels_source: str | Path
) -> None:
    """Raise unless the image and label files hold the same, non-zero number of samples."""
    if n_images == 0:
        raise DatasetError(f"{images_source}: holds 0 images; every split needs at least one")
    if n_images != n_labels:
        raise DatasetError(
            f"{labels_source}: expected {n_images} labels (the number of images in "
            f"{images_source}), found {n_labels}"
        )


def check_labels(labels: np.ndarray, num_classes: int, source: str | Path) -> None:
    """Raise unless ``labels`` is 1-D and every label lies in ``[0, num_classes)``."""
    if labels.ndim != 1:
        raise DatasetError(f"{source}: expected 1-D labels, found shape {list(labels.shape)}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetError(
            f"{source}: expected labels in [0, {num_classes}), found values in "
            f"[{labels.min()}, {labels.max()}]"
        )
