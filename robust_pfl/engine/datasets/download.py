"""Optional, opt-in downloads of the file-based data sets, verified by checksum.

Nothing here runs unless called with ``allow=True``; the loaders never download.
:data:`SOURCES` gives, for ``mnist``, ``fashion_mnist``, ``cifar10`` and ``cifar100``,
the files, their published MD5s and the mirrors that serve them; one downloader,
:func:`download_dataset`, serves them all.  Each file is fetched from the first mirror that
serves bytes matching its checksum and written atomically (a temporary file in ``dest``
renamed into place), so a failed or mismatching download leaves nothing behind.

A file passes if the MD5 of its bytes equals the published MD5 of the archive, or,
where the MD5 of the uncompressed contents is published too (MNIST's IDX files), if
the MD5 of its gunzipped contents equals that: a mirror that recompressed the same
data still verifies.

The CIFAR ``.tar.gz`` archives are unpacked into ``dest`` once they verify.  Every
member is checked before anything is written: an absolute path, a ``..`` component or
a member that is neither a regular file nor a directory (a link or a device could
make a later write land outside ``dest``) refuses the whole archive.  The archive is
kept beside what it unpacks to, so that a second call verifies it instead of fetching
it again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from robust_pfl.engine.datasets.base import DatasetError
from robust_pfl.engine.datasets.cifar import (
    CIFAR10_SUBDIR,
    CIFAR10_TEST,
    CIFAR10_TRAIN,
    CIFAR100_SUBDIR,
    CIFAR100_TEST,
    CIFAR100_TRAIN,
)
from robust_pfl.engine.datasets.idx import GZIP_MAGIC
from robust_pfl.engine.datasets.paths import DATA_ENV_VAR

Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class Checksum:
    """The published MD5s of one file: of the file as served (``archive_md5``) and, where
    one is published, of its gunzipped contents (``content_md5``; ``None``: none is)."""

    archive_md5: str
    content_md5: str | None = None


@dataclass(frozen=True)
class Source:
    """Where one data set's files come from and what the loader reads of them.

    Attributes:
        title: the data set's name in messages.
        mirrors: URL prefixes tried in order; a file's name is appended to each.
        checksums: file name -> its published :class:`Checksum`.
        published: where the checksums come from (for messages and docs).
        unpacked: for a ``.tar.gz`` source, the files (relative to ``dest``) the loader
            reads once the archive is unpacked; empty when the downloaded files are read
            as they are.
    """

    title: str
    mirrors: tuple[str, ...]
    checksums: Mapping[str, Checksum]
    published: str
    unpacked: tuple[str, ...] = ()


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

#: Zalando's own hosts: the S3 site the Fashion-MNIST README links each file to (plain
#: http: that site serves no https, and every file is checked against its published MD5
#: before it is written), then the ``data/fashion`` folder of Zalando's repository.
FASHION_MNIST_MIRRORS: tuple[str, ...] = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)

#: The MD5s of the ``.gz`` files in the "Get the Data" table of the Fashion-MNIST README
#: (https://github.com/zalandoresearch/fashion-mnist); it publishes none of the contents.
FASHION_MNIST_CHECKSUMS: dict[str, Checksum] = {
    "train-images-idx3-ubyte.gz": Checksum("8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "train-labels-idx1-ubyte.gz": Checksum("25c81989df183df01b3e8a0aad5dffbe"),
    "t10k-images-idx3-ubyte.gz": Checksum("bef4ecab320f06d8554ea6380940ec79"),
    "t10k-labels-idx1-ubyte.gz": Checksum("bb300cfdad3c16e7a12a480ee83cd310"),
}

#: The CIFAR page (https://www.cs.toronto.edu/~kriz/cifar.html) links the python
#: versions from here and gives their MD5s beside the links.
CIFAR_MIRRORS: tuple[str, ...] = ("https://www.cs.toronto.edu/~kriz/",)

#: What :func:`download_dataset` can fetch, by the loaders' data set names.
SOURCES: dict[str, Source] = {
    "mnist": Source(
        "MNIST", MNIST_MIRRORS, MNIST_CHECKSUMS,
        "torchvision's MNIST resource list for the archives (yann.lecun.com publishes no checksums) and the "
        "uncompressed IDX files' widely used MD5s",
    ),
    "fashion_mnist": Source(
        "Fashion-MNIST", FASHION_MNIST_MIRRORS, FASHION_MNIST_CHECKSUMS,
        "the Fashion-MNIST README (https://github.com/zalandoresearch/fashion-mnist)",
    ),
    "cifar10": Source(
        "CIFAR-10", CIFAR_MIRRORS, {"cifar-10-python.tar.gz": Checksum("c58f30108f718f92721af3b95e74349a")},
        "the CIFAR page (https://www.cs.toronto.edu/~kriz/cifar.html)",
        tuple(f"{CIFAR10_SUBDIR}/{name}" for name in (*CIFAR10_TRAIN, *CIFAR10_TEST)),
    ),
    "cifar100": Source(
        "CIFAR-100", CIFAR_MIRRORS, {"cifar-100-python.tar.gz": Checksum("eb9058c3a382ffc7106e4002c42a8d85")},
        "the CIFAR page (https://www.cs.toronto.edu/~kriz/cifar.html)",
        tuple(f"{CIFAR100_SUBDIR}/{name}" for name in (*CIFAR100_TRAIN, *CIFAR100_TEST)),
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
    if checksum.content_md5 is None:
        return f"{source}: checksum mismatch: expected MD5 {checksum.archive_md5}, found {found}"
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
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (SOURCES' mirrors; MD5-checked)
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


def dataset_source(dataset: str) -> tuple[str, Source]:
    """``(key, source)`` of ``dataset`` in :data:`SOURCES` (``-`` reads as ``_``, as in
    :func:`~robust_pfl.engine.datasets.load_dataset`).

    Raises:
        DatasetError: no download is known for ``dataset``.
    """
    key = dataset.strip().lower().replace("-", "_")
    if key not in SOURCES:
        raise DatasetError(f"no download for dataset {dataset!r}; allowed: {', '.join(SOURCES)}")
    return key, SOURCES[key]


def download_dataset(
    dataset: str,
    dest: str | Path,
    *,
    allow: bool = False,
    mirrors: Sequence[str] | None = None,
    fetch: Fetch | None = None,
    checksums: Mapping[str, Checksum] | None = None,
) -> Path:
    """Download ``dataset``'s files into ``dest`` (created if needed) and unpack its
    archive there, so that ``dest`` serves as the data set's ``data_dir``.

    Files already in ``dest`` that verify are kept and not fetched again; a kept archive
    is unpacked again only when a file the loader reads from it is missing.

    Args:
        dataset: a key of :data:`SOURCES`: ``"mnist"``, ``"fashion_mnist"``,
            ``"cifar10"`` or ``"cifar100"``.
        dest: the directory to write.
        allow: must be ``True``; downloading is off by default.
        mirrors: URL prefixes tried in order for each file (``None``: the source's).
        fetch: ``url -> bytes``; defaults to ``urllib`` (tests inject a fake).
        checksums: file name -> expected :class:`Checksum` (``None``: the published
            ones; tests substitute their fixtures').

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        DownloadRefused: ``allow`` is not ``True``.
        DatasetError: an unknown data set, no mirror served a file matching its
            checksum, or an archive holds an unsafe member or lacks a file the loader
            reads.  Nothing is written for that file; a ``dest`` this call created is
            removed again when it is still empty.
    """
    key, source = dataset_source(dataset)
    if allow is not True:
        raise DownloadRefused(
            f"downloading {source.title} is off by default; call download_dataset({key!r}, dest, allow=True) "
            f"or run `robust-pfl download {key} DEST` to fetch it, or place the files in a directory "
            f"yourself and name it with data_dir or {DATA_ENV_VAR}"
        )
    mirrors = source.mirrors if mirrors is None else mirrors
    checksums = source.checksums if checksums is None else checksums
    dest = Path(dest)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        for name, checksum in checksums.items():
            _obtain(dest, name, checksum, mirrors, fetch or _urllib_fetch, source.unpacked)
    except DatasetError as error:
        if created and not any(dest.iterdir()):
            dest.rmdir()  # a failed first download leaves nothing behind
        raise DatasetError(f"{error}. {_by_hand(source, checksums)}") from None
    return dest


def download_mnist(
    dest: str | Path,
    *,
    allow: bool = False,
    mirrors: Sequence[str] = MNIST_MIRRORS,
    fetch: Fetch | None = None,
    checksums: Mapping[str, Checksum] = MNIST_CHECKSUMS,
) -> Path:
    """:func:`download_dataset` of ``"mnist"``: the four MNIST ``.gz`` files into ``dest``."""
    return download_dataset("mnist", dest, allow=allow, mirrors=mirrors, fetch=fetch, checksums=checksums)


def _by_hand(source: Source, checksums: Mapping[str, Checksum]) -> str:
    """How to put the files in place without this module (the end of its errors)."""
    files = ", ".join(checksums)
    if source.unpacked:
        what = f"unpack {files} into one directory (the loader reads {', '.join(source.unpacked)} there)"
    else:
        what = f"put {files} in one directory"
    return (
        f"To place the files by hand, {what} and name it with data_dir = \"DIR\" in the config's "
        f"[task] table (or set {DATA_ENV_VAR}); the MD5s to check them against are from {source.published}"
    )


def _obtain(
    dest: Path, name: str, checksum: Checksum, mirrors: Sequence[str], fetch: Fetch, unpacked: Sequence[str]
) -> None:
    """``dest / name`` verified (kept if already there and verified, else fetched) and,
    when ``unpacked`` names files the loader reads from it, unpacked unless they are all
    there.  The archive is written only after it has unpacked."""
    path = dest / name
    existing = path.read_bytes() if path.is_file() else None
    if existing is not None and checksum_problem(existing, checksum, path) is None:
        if all((dest / file).is_file() for file in unpacked):
            return
        data, kept = existing, True
    else:
        data, kept = _fetch_verified(name, checksum, mirrors, fetch), False
    if unpacked:
        unpack_tar(data, dest, name, unpacked)
    if not kept:
        _write_atomically(path, data)


def _fetch_verified(name: str, checksum: Checksum, mirrors: Sequence[str], fetch: Fetch) -> bytes:
    """The bytes of ``name`` from the first of ``mirrors`` that serves them verified."""
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
            return data
        failures.append(problem)
    reasons = "; ".join(failures or ["no mirrors given"])
    raise DatasetError(f"could not download {name}: {reasons}")


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why unpacking ``member`` could write outside the destination or create something
    other than plain files and folders, or ``None`` when it is safe.

    Both ``/`` and ``\\`` count as separators and a drive letter as absolute, so that a
    name that is harmless on POSIX cannot escape on Windows either.
    """
    posix, windows = PurePosixPath(member.name), PureWindowsPath(member.name)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or windows.root:
        return f"{member.name!r} is an absolute path"
    if ".." in posix.parts or ".." in windows.parts:
        return f"{member.name!r} has a '..' component"
    if not (member.isfile() or member.isdir()):
        return f"{member.name!r} is neither a regular file nor a directory"
    if member.isfile() and not posix.parts:
        return f"{member.name!r} is a file without a name"
    return None


def unpack_tar(data: bytes, dest: Path, source: str | Path, required: Sequence[str] = ()) -> None:
    """Unpack the (compressed or plain) tar archive ``data`` into ``dest``.

    Every member is checked (:func:`member_problem`) and ``required`` (paths relative to
    ``dest``) looked for before anything is written; the regular files are then written
    to a scratch folder in ``dest`` and renamed into place, so that a read error half-way
    leaves no partly unpacked tree.  Directories are created as the files need them;
    modes, owners and times in the archive are ignored.

    Raises:
        DatasetError: ``data`` is not a readable tar archive, a member is unsafe (all
            are named), or a ``required`` file is not in it.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            members = archive.getmembers()
            problems = [problem for member in members if (problem := member_problem(member)) is not None]
            if problems:
                raise DatasetError(f"{source}: refusing to unpack the archive: {'; '.join(problems)}")
            files = {PurePosixPath(m.name).as_posix(): m for m in members if m.isfile()}
            missing = [file for file in required if file not in files]
            if missing:
                raise DatasetError(f"{source}: the archive lacks {', '.join(missing)}")
            with tempfile.TemporaryDirectory(dir=dest, prefix=".unpack-") as scratch:
                for relative, member in files.items():
                    _copy_member(archive, member, Path(scratch, relative))
                for relative in files:
                    target = dest / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(Path(scratch, relative), target)
    except (tarfile.TarError, EOFError, zlib.error) as error:
        raise DatasetError(f"{source}: not a readable tar archive ({type(error).__name__}: {error})") from None


def _copy_member(archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    """Write a regular file ``member`` of ``archive`` to ``target`` and sync it to disk."""
    target.parent.mkdir(parents=True, exist_ok=True)
    stream = archive.extractfile(member)
    if stream is None:  # tarfile returns None only for non-files, which are refused above
        raise DatasetError(f"{member.name!r}: not a regular file")
    with stream, target.open("wb") as file:
        shutil.copyfileobj(stream, file)
        file.flush()
        os.fsync(file.fileno())
