"""MNIST and Fashion-MNIST from the original IDX files (gzipped or not).

IDX layout: two zero bytes, a type code byte, a dimension count byte, one big-endian
int32 per dimension, then the values, big-endian, in C order.  Gzip is detected from
the file's first two bytes (``1f 8b``), never from its name.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from robust_pfl.engine.datasets.base import DatasetError, LabelledImages, check_counts, check_labels
from robust_pfl.engine.datasets.paths import first_existing, missing_files_error, resolve_data_dir

#: IDX type code -> numpy dtype of the stored (big-endian) values.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
UBYTE = 0x08
GZIP_MAGIC = b"\x1f\x8b"

#: The standard file names (each may also carry a ``.gz`` suffix) by role.
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_file_bytes(path: Path) -> bytes:
    """A file's bytes, decompressed when they start with the gzip magic ``1f 8b``."""
    raw = path.read_bytes()
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:
        raise DatasetError(f"{path}: gzip data is corrupt or truncated ({error})") from error


def parse_idx(
    data: bytes, source: str | Path, *, dtype_code: int | None = None, ndim: int | None = None
) -> np.ndarray:
    """Decode IDX ``data`` into an array of native byte order.

    Args:
        data: the (decompressed) file contents.
        source: the file, named in errors.
        dtype_code: the type code required (e.g. ``0x08``), or ``None`` for any valid one.
        ndim: the number of dimensions required, or ``None`` for any.

    Raises:
        DatasetError: bad magic, unknown or unexpected type code, unexpected dimension
            count, a negative dimension or one larger than the payload, or a header or
            payload of the wrong length.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DatasetError(
            f"{source}: not an IDX file: expected magic 0x0000 followed by a type code and a "
            f"dimension count, found {data[:4].hex() or 'an empty file'}"
        )
    code, dims = data[2], data[3]
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_DTYPES)
        raise DatasetError(
            f"{source}: expected an IDX type code in {{{known}}}, found 0x{code:02X}"
        )
    if dtype_code is not None and code != dtype_code:
        raise DatasetError(
            f"{source}: expected IDX type code 0x{dtype_code:02X} ({IDX_DTYPES[dtype_code]}), "
            f"found 0x{code:02X} ({IDX_DTYPES[code]})"
        )
    if ndim is not None and dims != ndim:
        raise DatasetError(f"{source}: expected {ndim} dimensions, found {dims}")
    header = 4 + 4 * dims
    if len(data) < header:
        raise DatasetError(
            f"{source}: truncated header: expected {header} bytes for {dims} dimensions, "
            f"found {len(data)}"
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=dims, offset=4))
    dtype = IDX_DTYPES[code]
    found = len(data) - header
    for axis, size in enumerate(shape):
        if size < 0:
            raise DatasetError(f"{source}: corrupt header: dimension {axis} of shape {list(shape)} is negative ({size})")
        if size * dtype.itemsize > found and all(shape):
            raise DatasetError(
                f"{source}: dimension {axis} of the header's shape {list(shape)} is {size}, more values than "
                f"the {found} bytes of data hold (a corrupt header or a truncated file)"
            )
    expected = math.prod(shape) * dtype.itemsize  # Python integers: no overflow
    if found != expected:
        kind = "truncated payload" if found < expected else "trailing bytes after payload"
        raise DatasetError(
            f"{source}: {kind}: expected {expected} bytes of data for shape {list(shape)}, "
            f"found {found}"
        )
    values = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return values.astype(dtype.newbyteorder("="), copy=False)


def read_idx(
    path: str | Path, *, dtype_code: int | None = None, ndim: int | None = None
) -> np.ndarray:
    """Read an IDX file (gzipped or not); see :func:`parse_idx` for the checks."""
    path = Path(path)
    return parse_idx(read_file_bytes(path), path, dtype_code=dtype_code, ndim=ndim)


def _read_split(
    images_path: Path, labels_path: Path, image_size: tuple[int, int], num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(images [n, 1, H, W] uint8, labels [n])`` of one split, validated."""
    images = read_idx(images_path, dtype_code=UBYTE, ndim=3)
    labels = read_idx(labels_path, dtype_code=UBYTE, ndim=1)
    if images.shape[1:] != image_size:
        raise DatasetError(
            f"{images_path}: expected {image_size[0]}x{image_size[1]} images, "
            f"found {images.shape[1]}x{images.shape[2]}"
        )
    check_counts(images.shape[0], labels.shape[0], images_path, labels_path)
    check_labels(labels, num_classes, labels_path)
    return images[:, None], labels


def load_idx_dataset(
    data_dir: str | Path | None,
    name: str,
    *,
    image_size: tuple[int, int] = (28, 28),
    num_classes: int = 10,
) -> LabelledImages:
    """Load the four standard IDX files of an MNIST-like data set.

    Args:
        data_dir: directory holding ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
            ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each optionally
            ``.gz``); ``None`` resolves it from ``$ROBUST_PFL_DATA`` (see
            :func:`~robust_pfl.engine.datasets.paths.resolve_data_dir`).
        name: the data set's name (errors, ``$ROBUST_PFL_DATA/<name>``).
        image_size: required ``(H, W)``.
        num_classes: labels must lie in ``[0, num_classes)``.
    """
    candidates = {role: (base, base + ".gz") for role, base in IDX_FILES.items()}
    markers = [file for names in candidates.values() for file in names]
    directory = resolve_data_dir(data_dir, name, markers=markers)
    paths = {role: first_existing(directory, names) for role, names in candidates.items()}
    missing = [f"{IDX_FILES[role]}[.gz]" for role, path in paths.items() if path is None]
    if missing:
        expected = [f"{base}[.gz]" for base in IDX_FILES.values()]
        raise missing_files_error(directory, expected, name, missing)
    train = _read_split(paths["train_images"], paths["train_labels"], image_size, num_classes)
    test = _read_split(paths["test_images"], paths["test_labels"], image_size, num_classes)
    return LabelledImages.from_arrays(name, num_classes, train, test)


def load_mnist(data_dir: str | Path | None = None) -> LabelledImages:
    """MNIST: 60000 train and 10000 test 28x28 grey digits, 10 classes."""
    return load_idx_dataset(data_dir, "mnist")


def load_fashion_mnist(data_dir: str | Path | None = None) -> LabelledImages:
    """Fashion-MNIST: the same layout and file names as MNIST, in its own directory."""
    return load_idx_dataset(data_dir, "fashion_mnist")
