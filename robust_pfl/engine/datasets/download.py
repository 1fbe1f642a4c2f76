"""Optional, opt-in download of the MNIST files, verified by checksum.

Nothing here runs unless called with ``allow=True``; the loaders never download.
Each file is fetched from the first mirror that serves bytes matching its checksum
and written atomically (a temporary file in ``dest`` renamed into place), so a failed
or mismatching download leaves nothing behind.

A file passes if the MD5 of its bytes equals the published MD5 of the ``.gz`` archive,
or the MD5 of its (gunzipped) contents equals the published MD5 of the uncompressed
IDX file: a mirror that recompressed the same data still verifies.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from robust_pfl.engine.datasets.base import DatasetError
from robust_pfl.engine.datasets.idx import GZIP_MAGIC

Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class Checksum:
    """The published MD5s of one file: of the ``.gz`` archive and of its contents."""

    archive_md5: str
    content_md5: str


#: Mirrors tried in order; each is a URL prefix to which the file name is appended.
MNIST_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

#: MD5s of the original MNIST files (archive: the ``.gz`` as published; content: the
#: uncompressed IDX file).
MNIST_CHECKSUMS: dict[str, Checksum] = {
    "train-images-idx3-ubyte.gz": Checksum(
        "f68b3c2dcbeaaa9fbdd348bbdeb94873", "6bbc9ace898e44ae57da46a324031adb"
    ),
    "train-labels-idx1-ubyte.gz": Checksum(
        "d53e105ee54ea40749a09fcbcd1e9432", "a25bea736e30d166cdddb491f175f624"
    ),
    "t10k-images-idx3-ubyte.gz": Checksum(
        "9fb629c4189551a2d022fa330f9573f3", "2646ac647ad5339dbf082846283269ea"
    ),
    "t10k-labels-idx1-ubyte.gz": Checksum(
        "ec29112dd5afa0611ce80d1b7f02629c", "27ae3e4e09519cfbb04c329615203637"
    ),
}


class DownloadRefused(DatasetError):
    """A download was requested without ``allow=True``."""


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def checksum_problem(data: bytes, checksum: Checksum, source: str | Path) -> str | None:
    """``None`` if ``data`` matches ``checksum`` (archive or contents), else why not."""
    found = _md5(data)
    if found == checksum.archive_md5:
        return None
    if data.startswith(GZIP_MAGIC):
        try:
            content = _md5(gzip.decompress(data))
        except Exception as error:  # corrupt gzip: report, do not raise
            return f"{source}: corrupt gzip data ({error})"
    else:
        content = found
    if content == checksum.content_md5:
        return None
    return (
        f"{source}: checksum mismatch: expected MD5 {checksum.archive_md5} (archive) or "
        f"{checksum.content_md5} (contents), found {found} (archive) / {content} (contents)"
    )


def verify_files(
    directory: str | Path, checksums: Mapping[str, Checksum] = MNIST_CHECKSUMS
) -> None:
    """Raise :class:`DatasetError` unless every file of ``checksums`` in ``directory``
    exists and verifies (e.g. ``verify_files("/data/mnist")``)."""
    directory = Path(directory)
    problems = []
    for name, checksum in checksums.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif (problem := checksum_problem(path.read_bytes(), checksum, path)) is not None:
            problems.append(problem)
    if problems:
        raise DatasetError("; ".join(problems))


def _urllib_fetch(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (https mirrors)
        return response.read()


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def download_mnist(
    dest: str | Path,
    *,
    allow: bool = False,
    mirrors: Sequence[str] = MNIST_MIRRORS,
    fetch: Fetch | None = None,
    checksums: Mapping[str, Checksum] = MNIST_CHECKSUMS,
) -> Path:
    """Download the four MNIST ``.gz`` files into ``dest`` (created if needed).

    Files already in ``dest`` that verify are kept and not fetched again.

    Args:
        dest: the directory to write (later usable as ``--data-dir``).
        allow: must be ``True``; downloading is off by default.
        mirrors: URL prefixes tried in order for each file.
        fetch: ``url -> bytes``; defaults to ``urllib`` (tests inject a fake).
        checksums: file name -> expected :class:`Checksum`.

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        DownloadRefused: ``allow`` is not ``True``.
        DatasetError: no mirror served a file matching its checksum (nothing is
            written for that file).
    """
    if allow is not True:
        raise DownloadRefused(
            "downloading MNIST is off by default; call download_mnist(dest, allow=True) to "
            "fetch it, or place the files in a directory yourself and pass --data-dir / "
            "set ROBUST_PFL_DATA"
        )
    fetch = fetch or _urllib_fetch
    dest = Path(dest)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        _fetch_all(dest, mirrors, fetch, checksums)
    except DatasetError as error:
        if created and not any(dest.iterdir()):
            dest.rmdir()  # a failed first download leaves nothing behind
        by_hand = ", ".join(checksums)
        raise DatasetError(
            f"{error}. To place the files by hand, put {by_hand} in one directory and name it with "
            f"data_dir = \"DIR\" in the config's [task] table (or --data-dir DIR)"
        ) from None
    return dest


def _fetch_all(dest: Path, mirrors: Sequence[str], fetch: Fetch, checksums: Mapping[str, Checksum]) -> None:
    """Every file of ``checksums`` into ``dest`` from the first mirror that serves it
    verified; files already there that verify are kept."""
    for name, checksum in checksums.items():
        path = dest / name
        if path.is_file() and checksum_problem(path.read_bytes(), checksum, path) is None:
            continue
        failures = []
        for mirror in mirrors:
            url = mirror.rstrip("/") + "/" + name
            try:
                data = fetch(url)
            except OSError as error:  # urllib's URLError and HTTPError are OSErrors
                failures.append(f"{url}: {error}")
                continue
            problem = checksum_problem(data, checksum, url)
            if problem is None:
                _write_atomically(path, data)
                break
            failures.append(problem)
        else:
            reasons = "; ".join(failures or ["no mirrors given"])
            raise DatasetError(f"could not download {name}: {reasons}")
