"""scikit-learn's bundled 8x8 handwritten digits: the file-free default data set."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from robust_pfl.engine.datasets.base import DatasetError, LabelledImages

DIGITS_MAX = 16.0  # pixel values are counts 0..16


def load_digits(*, test_fraction: float = 0.2, seed: int = 0) -> LabelledImages:
    """The 1797 8x8 digits of :func:`sklearn.datasets.load_digits`, split train/test.

    The split is a fixed permutation drawn from ``numpy.random.default_rng(seed)``: the
    same ``seed`` and ``test_fraction`` always give the same split.

    Args:
        test_fraction: share of the images put in the test split, in ``(0, 1)``;
            ``round(test_fraction * 1797)`` test images.
        seed: the permutation's seed.

    Returns:
        Images ``[n, 1, 8, 8]`` scaled from ``0..16`` to ``[0, 1]``, 10 classes.
    """
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"digits: test_fraction must lie in (0, 1), found {test_fraction}")
    images, labels = _bundled_digits()
    n_test = round(test_fraction * len(labels))
    if not 0 < n_test < len(labels):
        raise DatasetError(
            f"digits: test_fraction {test_fraction} leaves {n_test} of {len(labels)} images "
            f"for testing; both splits must be non-empty"
        )
    order = np.random.default_rng(seed).permutation(len(labels))
    test, train = order[:n_test], order[n_test:]
    return LabelledImages.from_arrays(
        "digits",
        10,
        (images[train], labels[train]),
        (images[test], labels[test]),
        max_value=DIGITS_MAX,
    )


def _bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images ``[1797, 1, 8, 8]`` and labels of scikit-learn's bundled digits.

    Read straight from the CSV that scikit-learn ships (64 pixel columns and the label
    per row), located without importing scikit-learn: its import costs seconds, which
    every quick-start run and test would pay.  Falls back to
    :func:`sklearn.datasets.load_digits` if the file is not where it used to be.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DatasetError("digits: scikit-learn is not installed (pip install scikit-learn)")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1].reshape(-1, 1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    return np.asarray(bunch.images)[:, None], np.asarray(bunch.target)
