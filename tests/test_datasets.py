"""Data set loaders: IDX, CIFAR pickles, bundled digits, registry, opt-in download.

Every file is generated in ``tmp_path``; nothing touches the network.  The ``slow`` test
reads the real MNIST files from ``$ROBUST_PFL_DATA`` (or ``/work/shared/data/mnist``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from robust_pfl.engine.datasets import (
    DATA_ENV_VAR,
    DATASETS,
    DatasetError,
    DownloadRefused,
    LabelledImages,
    download_mnist,
    load_cifar10,
    load_cifar100,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    read_idx,
    resolve_data_dir,
    verify_files,
)
from robust_pfl.engine.datasets.download import MNIST_CHECKSUMS, Checksum
from robust_pfl.engine.datasets.idx import IDX_DTYPES, IDX_FILES

RNG = np.random.default_rng(1234)


# ----------------------------------------------------------------------------- IDX helpers


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """``array`` encoded as an IDX file with type code ``code``."""
    dtype = IDX_DTYPES[code]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    return header + np.ascontiguousarray(array, dtype=dtype).tobytes()


def write(path: Path, data: bytes, *, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def mnist_arrays(
    n_train: int = 6, n_test: int = 4, size: tuple[int, int] = (28, 28)
) -> dict[str, np.ndarray]:
    return {
        "train_images": RNG.integers(0, 256, (n_train, *size), dtype=np.uint8),
        "train_labels": np.arange(n_train, dtype=np.uint8) % 10,
        "test_images": RNG.integers(0, 256, (n_test, *size), dtype=np.uint8),
        "test_labels": (np.arange(n_test, dtype=np.uint8) * 3) % 10,
    }


def write_mnist(
    directory: Path, arrays: dict[str, np.ndarray] | None = None, *, gz: bool = False
) -> dict[str, np.ndarray]:
    """Write the four IDX files (``.gz`` names when ``gz``) and return their arrays."""
    arrays = mnist_arrays() if arrays is None else arrays
    directory.mkdir(parents=True, exist_ok=True)
    for role, base in IDX_FILES.items():
        write(directory / (base + (".gz" if gz else "")), idx_bytes(arrays[role]), gz=gz)
    return arrays


def assert_matches(data: LabelledImages, arrays: dict[str, np.ndarray]) -> None:
    for split in ("train", "test"):
        images = getattr(data, f"{split}_images")
        labels = getattr(data, f"{split}_labels")
        expected = torch.from_numpy(arrays[f"{split}_images"].astype(np.float32) / 255)
        assert images.dtype == torch.float32 and labels.dtype == torch.int64
        assert images.shape == (len(expected), 1, 28, 28)
        assert torch.equal(images[:, 0], expected)
        assert torch.equal(labels, torch.from_numpy(arrays[f"{split}_labels"].astype(np.int64)))
        assert 0.0 <= images.min() and images.max() <= 1.0


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, gz):
    arrays = write_mnist(tmp_path, gz=gz)
    data = load_mnist(tmp_path)
    assert_matches(data, arrays)
    assert data.name == "mnist" and data.num_classes == 10
    assert data.image_shape == (1, 28, 28) and data.num_features == 784
    assert (data.num_train, data.num_test) == (6, 4)
    assert load_fashion_mnist(tmp_path).name == "fashion_mnist"


def test_gzip_detected_by_content_not_extension(tmp_path):
    arrays = mnist_arrays()
    for i, (role, base) in enumerate(IDX_FILES.items()):
        if i % 2:  # gzip content under the plain name
            write(tmp_path / base, idx_bytes(arrays[role]), gz=True)
        else:  # plain content under a .gz name
            write(tmp_path / (base + ".gz"), idx_bytes(arrays[role]), gz=False)
    assert_matches(load_mnist(tmp_path), arrays)


@pytest.mark.parametrize("code", sorted(IDX_DTYPES))
def test_read_idx_every_type_code(tmp_path, code):
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(IDX_DTYPES[code].newbyteorder("="))
    if code == 0x08:
        array = np.abs(array)
    path = write(tmp_path / "x.idx", idx_bytes(array, code), gz=bool(code % 2))
    found = read_idx(path)
    assert found.dtype == array.dtype and found.dtype.isnative
    np.testing.assert_array_equal(found, array)


def _set_byte(index: int, value: int):
    def corrupt(data: bytes) -> bytes:
        return data[:index] + bytes([value]) + data[index + 1 :]

    return corrupt


# (file role corrupted, bytes -> bytes or arrays -> arrays, expected message fragment)
BYTE_CORRUPTIONS = {
    "wrong magic": ("train_images", _set_byte(0, 1), "magic"),
    "unknown dtype code": ("train_images", _set_byte(2, 0x07), "type code"),
    "unexpected dtype code": ("test_labels", _set_byte(2, 0x0D), "expected IDX type code 0x08"),
    "truncated payload": ("train_images", lambda d: d[:-1], "truncated payload"),
    "trailing bytes": ("test_images", lambda d: d + b"\0", "trailing bytes"),
    "truncated header": ("train_labels", lambda d: d[:6], "truncated header"),
    "empty file": ("train_labels", lambda d: b"", "not an IDX file"),
}


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("case", sorted(BYTE_CORRUPTIONS))
def test_corrupt_idx_bytes(tmp_path, case, gz):
    role, corrupt, fragment = BYTE_CORRUPTIONS[case]
    arrays = write_mnist(tmp_path, gz=gz)
    path = tmp_path / (IDX_FILES[role] + (".gz" if gz else ""))
    write(path, corrupt(idx_bytes(arrays[role])), gz=gz)
    with pytest.raises(DatasetError, match=fragment) as error:
        load_mnist(tmp_path)
    assert str(path) in str(error.value)


ARRAY_CORRUPTIONS = {
    "wrong ndim": ("train_labels", lambda a: a[:, None], "expected 1 dimensions, found 2"),
    "images ndim": ("test_images", lambda a: a[:, :, :, None], "expected 3 dimensions, found 4"),
    "count mismatch": ("train_labels", lambda a: a[:-1], "expected 6 labels"),
    "label out of range": ("test_labels", lambda a: (a + 10).astype(np.uint8), r"\[0, 10\)"),
    "wrong image size": ("train_images", lambda a: a[:, :27], "expected 28x28 images, found 27x28"),
}


@pytest.mark.parametrize("case", sorted(ARRAY_CORRUPTIONS))
def test_invalid_idx_contents(tmp_path, case):
    role, change, fragment = ARRAY_CORRUPTIONS[case]
    arrays = write_mnist(tmp_path)
    path = write(tmp_path / IDX_FILES[role], idx_bytes(change(arrays[role])))
    with pytest.raises(DatasetError, match=fragment) as error:
        load_mnist(tmp_path)
    assert str(path) in str(error.value)


def test_corrupt_gzip_names_file(tmp_path):
    arrays = write_mnist(tmp_path, gz=True)
    path = tmp_path / (IDX_FILES["train_labels"] + ".gz")
    path.write_bytes(gzip.compress(idx_bytes(arrays["train_labels"]))[:-8])
    with pytest.raises(DatasetError, match="gzip") as error:
        load_mnist(tmp_path)
    assert str(path) in str(error.value)


# ----------------------------------------------------------------------------- directories


def test_missing_directory_lists_expected_files(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as error:
        load_mnist(missing)
    message = str(error.value)
    assert str(missing) in message and "does not exist" in message
    assert all(base in message for base in IDX_FILES.values())
    assert DATA_ENV_VAR in message and "--data-dir" in message
    assert not isinstance(error.value, FileNotFoundError)


def test_missing_some_files_names_them(tmp_path):
    write_mnist(tmp_path)
    (tmp_path / IDX_FILES["test_labels"]).unlink()
    with pytest.raises(DatasetError, match=r"lacks t10k-labels-idx1-ubyte\[\.gz\];") as error:
        load_mnist(tmp_path)
    assert str(tmp_path) in str(error.value) and DATA_ENV_VAR in str(error.value)


def test_no_directory_and_no_env(monkeypatch):
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    with pytest.raises(DatasetError, match=f"{DATA_ENV_VAR} is not set"):
        load_dataset("mnist")


def test_env_var_subdirectory(tmp_path, monkeypatch):
    arrays = write_mnist(tmp_path / "mnist")
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    markers = ["train-images-idx3-ubyte"]
    assert resolve_data_dir(None, "mnist", markers=markers) == tmp_path / "mnist"
    assert_matches(load_mnist(), arrays)
    assert_matches(load_dataset("mnist"), arrays)


def test_env_var_directory_holds_files(tmp_path, monkeypatch):
    arrays = write_mnist(tmp_path, gz=True)
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    assert_matches(load_mnist(), arrays)


def test_env_var_without_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    with pytest.raises(DatasetError) as error:
        load_fashion_mnist()
    message = str(error.value)
    assert str(tmp_path / "fashion_mnist") in message and "train-images-idx3-ubyte" in message


def test_explicit_directory_beats_env(tmp_path, monkeypatch):
    explicit = write_mnist(tmp_path / "explicit")
    write_mnist(tmp_path / "env" / "mnist")
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "env"))
    assert_matches(load_mnist(tmp_path / "explicit"), explicit)
    # an explicit root holding a <dataset> subdirectory also works
    found = resolve_data_dir(tmp_path / "env", "mnist", markers=["train-images-idx3-ubyte"])
    assert found == tmp_path / "env" / "mnist"


# ----------------------------------------------------------------------------- CIFAR


def write_batch(path: Path, batch: dict) -> Path:
    with path.open("wb") as file:
        pickle.dump(batch, file, protocol=2)
    return path


def cifar_batch(n: int, label_keys: dict[bytes, int]) -> dict:
    batch = {b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8), b"batch_label": b"x"}
    for key, classes in label_keys.items():
        batch[key] = [int(v) for v in RNG.integers(0, classes, n)]
    return batch


def write_cifar10(directory: Path, n: int = 3) -> dict[str, dict]:
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {name: cifar_batch(n, {b"labels": 10}) for name in names}
    for name, batch in batches.items():
        write_batch(directory / name, batch)
    return batches


def write_cifar100(directory: Path, n: int = 4) -> dict[str, dict]:
    directory.mkdir(parents=True, exist_ok=True)
    labels = {b"fine_labels": 100, b"coarse_labels": 20}
    batches = {name: cifar_batch(n, labels) for name in ("train", "test")}
    for name, batch in batches.items():
        write_batch(directory / name, batch)
    return batches


@pytest.mark.parametrize("nested", [False, True])
def test_cifar10_round_trip(tmp_path, nested):
    batches = write_cifar10(tmp_path / "cifar-10-batches-py" if nested else tmp_path)
    data = load_cifar10(tmp_path)
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    expected = np.concatenate([b[b"data"] for b in train]).reshape(-1, 3, 32, 32)
    assert data.train_images.shape == (15, 3, 32, 32) and data.test_images.shape == (3, 3, 32, 32)
    assert torch.equal(data.train_images, torch.from_numpy(expected.astype(np.float32) / 255))
    assert data.train_labels.tolist() == sum((b[b"labels"] for b in train), [])
    assert data.test_labels.tolist() == batches["test_batch"][b"labels"]
    assert (data.num_classes, data.name, data.num_features) == (10, "cifar10", 3072)
    # pixel (c, h, w) of a row sits at c * 1024 + h * 32 + w
    row = batches["test_batch"][b"data"][0]
    assert data.test_images[0, 2, 1, 3] == row[2 * 1024 + 1 * 32 + 3] / 255


@pytest.mark.parametrize("kind, classes", [("fine", 100), ("coarse", 20)])
def test_cifar100_label_kinds(tmp_path, kind, classes):
    batches = write_cifar100(tmp_path / "cifar-100-python")
    data = load_dataset("cifar100", tmp_path, label_kind=kind)
    assert data.num_classes == classes and data.train_images.shape == (4, 3, 32, 32)
    assert data.train_labels.tolist() == batches["train"][f"{kind}_labels".encode()]
    assert data.name == ("cifar100" if kind == "fine" else "cifar100_coarse")


def test_cifar100_bad_label_kind(tmp_path):
    write_cifar100(tmp_path)
    with pytest.raises(DatasetError, match="label_kind"):
        load_cifar100(tmp_path, label_kind="medium")  # type: ignore[arg-type]


def test_cifar_str_keys_accepted(tmp_path):
    batches = write_cifar100(tmp_path)
    write_batch(tmp_path / "test", {k.decode(): v for k, v in batches["test"].items()})
    assert load_cifar100(tmp_path).test_labels.tolist() == batches["test"][b"fine_labels"]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewrite(change):
    def apply(path: Path) -> None:
        with path.open("rb") as file:
            batch = pickle.load(file, encoding="bytes")
        write_batch(path, change(batch))

    return apply


def _without(key: bytes):
    return _rewrite(lambda b: {k: v for k, v in b.items() if k != key})


def _replace(key: bytes, change):
    return _rewrite(lambda b: {**b, key: change(b[key])})


CIFAR_CORRUPTIONS = {
    "truncated pickle": (_truncate, "could not unpickle"),
    "garbage": (lambda p: p.write_bytes(b"not a pickle at all"), "could not unpickle"),
    "not a dict": (lambda p: write_batch(p, [1, 2, 3]), "expected a pickled dict"),
    "missing data": (_without(b"data"), "expected key b'data'"),
    "missing labels": (_without(b"labels"), "expected key b'labels'"),
    "wrong row length": (_replace(b"data", lambda d: d[:, :3000]), r"\[n, 3072\].*\[3, 3000\]"),
    "not uint8": (_replace(b"data", lambda d: d.astype(np.float32)), "found float32"),
    "label count mismatch": (_replace(b"labels", lambda v: v[:-1]), "expected 3 labels"),
    "label out of range": (_replace(b"labels", lambda v: [10] + v[1:]), r"\[0, 10\)"),
    "labels not integers": (_replace(b"labels", lambda v: [b"x"] * len(v)), "not a list of int"),
}


@pytest.mark.parametrize("case", sorted(CIFAR_CORRUPTIONS))
def test_corrupt_cifar(tmp_path, case):
    corrupt, fragment = CIFAR_CORRUPTIONS[case]
    write_cifar10(tmp_path)
    path = tmp_path / "data_batch_3"
    corrupt(path)
    with pytest.raises(DatasetError, match=fragment) as error:
        load_cifar10(tmp_path)
    assert str(path) in str(error.value)


def test_cifar_missing_files(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(DatasetError, match="lacks test_batch") as error:
        load_cifar10(tmp_path)
    assert "cifar-10-batches-py" in str(error.value) and DATA_ENV_VAR in str(error.value)


# ----------------------------------------------------------------------------- download


class FakeFetch:
    """``url -> bytes`` from a table; records the URLs asked; OSError for unknown ones."""

    def __init__(self, table: dict[str, bytes]):
        self.table, self.calls = table, []

    def __call__(self, url: str) -> bytes:
        self.calls.append(url)
        if url not in self.table:
            raise OSError(f"404 {url}")
        return self.table[url]


def test_download_refused_by_default(tmp_path):
    fetch = FakeFetch({})
    with pytest.raises(DownloadRefused, match="allow=True"):
        download_mnist(tmp_path / "mnist", fetch=fetch)
    assert fetch.calls == [] and not (tmp_path / "mnist").exists()


@pytest.mark.parametrize(
    "served, fragment",
    [(b"not really mnist", "checksum mismatch"), (b"\x1f\x8bbroken gzip", "corrupt gzip")],
)
def test_download_rejects_checksum_mismatch(tmp_path, served, fragment):
    fetch = FakeFetch({f"https://mirror.example/{name}": served for name in MNIST_CHECKSUMS})
    with pytest.raises(DatasetError, match=fragment):
        download_mnist(tmp_path, allow=True, mirrors=["https://mirror.example"], fetch=fetch)
    assert list(tmp_path.iterdir()) == []  # no file, no temporary left behind


def test_a_failed_first_download_leaves_no_directory_and_says_how_to_place_the_files(tmp_path):
    fetch = FakeFetch({})  # every mirror fails
    with pytest.raises(DatasetError) as caught:
        download_mnist(tmp_path / "new" / "mnist", allow=True, mirrors=["https://mirror.example"], fetch=fetch)
    assert not (tmp_path / "new" / "mnist").exists()
    message = str(caught.value)
    assert "by hand" in message and all(name in message for name in MNIST_CHECKSUMS) and "data_dir" in message


def test_download_verifies_and_writes(tmp_path):
    payload = idx_bytes(np.arange(5, dtype=np.uint8))
    archive = gzip.compress(payload, mtime=0)
    recompressed = gzip.compress(payload, compresslevel=1, mtime=1)
    md5 = lambda data: hashlib.md5(data).hexdigest()  # noqa: E731
    checksums = {
        "a.gz": Checksum(md5(archive), md5(payload)),  # matches the archive itself
        "b.gz": Checksum("0" * 32, md5(payload)),  # matches only by contents
    }
    fetch = FakeFetch({"https://two/a.gz": archive, "https://two/b.gz": recompressed})
    mirrors = ["https://one", "https://two/"]
    download_mnist(tmp_path, allow=True, mirrors=mirrors, fetch=fetch, checksums=checksums)
    assert (tmp_path / "a.gz").read_bytes() == archive
    assert (tmp_path / "b.gz").read_bytes() == recompressed
    assert fetch.calls == [f"https://{m}/{f}.gz" for f in "ab" for m in ("one", "two")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gz", "b.gz"]
    verify_files(tmp_path, checksums)
    # verified files already present are not fetched again
    fetch.calls.clear()
    download_mnist(tmp_path, allow=True, mirrors=["https://two"], fetch=fetch, checksums=checksums)
    assert fetch.calls == []


def test_verify_files_reports_problems(tmp_path):
    (tmp_path / "a.gz").write_bytes(b"abc")
    with pytest.raises(DatasetError, match="a.gz: checksum mismatch.*b.gz: missing"):
        verify_files(tmp_path, {name: Checksum("0" * 32, "1" * 32) for name in ("a.gz", "b.gz")})


# ----------------------------------------------------------------------------- digits, registry


@pytest.fixture(scope="module")
def digits() -> LabelledImages:
    return load_digits()


def test_digits(digits):
    assert digits.num_train + digits.num_test == 1797
    assert digits.num_test == round(0.2 * 1797)
    assert digits.image_shape == (1, 8, 8) and digits.num_classes == 10 and digits.name == "digits"
    splits = [(digits.train_images, digits.train_labels), (digits.test_images, digits.test_labels)]
    for images, labels in splits:
        assert images.min() >= 0.0 and images.max() <= 1.0
        assert set(labels.tolist()) == set(range(10))
    assert digits.train_images.max() == 1.0  # 16 -> 1


def test_digits_split_deterministic(digits):
    again = load_digits()
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(getattr(digits, field), getattr(again, field))
    other = load_digits(seed=1, test_fraction=0.5)
    assert other.num_test == round(0.5 * 1797)
    assert not torch.equal(other.test_labels[:100], digits.test_labels[:100])
    with pytest.raises(DatasetError, match="test_fraction"):
        load_digits(test_fraction=1.0)


def test_registry(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    assert set(DATASETS) == {"mnist", "fashion_mnist", "digits", "cifar10", "cifar100"}
    assert load_dataset("digits", tmp_path / "ignored", test_fraction=0.1).num_test == 180
    arrays = write_mnist(tmp_path / "fm")
    assert_matches(load_dataset("Fashion-MNIST", tmp_path / "fm"), arrays)
    allowed = "allowed: cifar10, cifar100, digits, fashion_mnist, mnist"
    with pytest.raises(DatasetError, match=allowed):
        load_dataset("imagenet")


def test_labelled_images_validates():
    images, labels = torch.zeros(3, 1, 2, 2), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(DatasetError, match="3 images but 2 labels"):
        LabelledImages(images, labels[:2], images, labels, 10, "x")
    with pytest.raises(DatasetError, match="int64"):
        LabelledImages(images, labels.int(), images, labels, 10, "x")


# ----------------------------------------------------------------------------- real MNIST

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
DEFAULT_REAL_MNIST = Path("/work/shared/data/mnist")


@pytest.mark.slow
def test_real_mnist():
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        markers = [f"{base}{suffix}" for base in IDX_FILES.values() for suffix in ("", ".gz")]
        try:
            directory = resolve_data_dir(None, "mnist", markers=markers)
        except DatasetError as error:
            pytest.skip(f"real MNIST not found under {DATA_ENV_VAR}={env}: {error}")
    elif DEFAULT_REAL_MNIST.is_dir():
        directory = DEFAULT_REAL_MNIST
    else:
        pytest.skip(f"real MNIST not available: set {DATA_ENV_VAR} or provide {DEFAULT_REAL_MNIST}")
    data = load_mnist(directory)
    assert (data.num_train, data.num_test) == (60000, 10000)
    assert data.train_labels.bincount(minlength=10).tolist() == MNIST_TRAIN_COUNTS
    assert data.test_labels.bincount(minlength=10).tolist() == MNIST_TEST_COUNTS
    assert data.train_images.min() == 0.0 and data.train_images.max() == 1.0
    if all((directory / name).is_file() for name in MNIST_CHECKSUMS):
        verify_files(directory)  # contents match the published checksums


def test_bundled_digits_file_equals_scikit_learns_loader():
    """The CSV read without importing scikit-learn is exactly ``load_digits()``."""
    from sklearn.datasets import load_digits as sklearn_digits

    from robust_pfl.engine.datasets.digits import _bundled_digits

    images, labels = _bundled_digits()
    reference = sklearn_digits()
    assert np.array_equal(images[:, 0], reference.images)
    assert np.array_equal(labels, reference.target)
