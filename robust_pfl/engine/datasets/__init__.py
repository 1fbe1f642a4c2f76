"""Image data sets as :class:`LabelledImages` (pure loading; no federation logic).

``load_dataset(name, data_dir)`` loads any of :data:`DATASETS`: ``digits`` (bundled with
scikit-learn, the quick-start default), ``mnist`` and ``fashion_mnist`` (IDX files),
``cifar10`` and ``cifar100`` (python pickle batches).  File-based sets are read from
``data_dir`` or ``$ROBUST_PFL_DATA``; :func:`download_dataset` fetches mnist, fashion_mnist,
cifar10 or cifar100 into a directory only when called with ``allow=True``.
"""

from robust_pfl.engine.datasets.base import DatasetError, LabelledImages
from robust_pfl.engine.datasets.cifar import load_cifar10, load_cifar100
from robust_pfl.engine.datasets.digits import load_digits
from robust_pfl.engine.datasets.download import DownloadRefused, download_dataset, download_mnist, verify_files
from robust_pfl.engine.datasets.idx import load_fashion_mnist, load_idx_dataset, load_mnist, read_idx
from robust_pfl.engine.datasets.paths import DATA_ENV_VAR, resolve_data_dir
from robust_pfl.engine.datasets.registry import DATASETS, load_dataset

__all__ = [
    "DATASETS",
    "DATA_ENV_VAR",
    "DatasetError",
    "DownloadRefused",
    "LabelledImages",
    "download_dataset",
    "download_mnist",
    "load_cifar10",
    "load_cifar100",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_idx_dataset",
    "load_mnist",
    "read_idx",
    "resolve_data_dir",
    "verify_files",
]
