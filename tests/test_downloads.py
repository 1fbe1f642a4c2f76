"""Opt-in downloads of mnist, fashion_mnist, cifar10 and cifar100, and the CIFAR-10
example config that uses what they write.

Nothing here touches the network: each test builds small files in the real formats
(gzipped IDX files, a ``.tar.gz`` of CIFAR pickle batches with ``bytes`` keys) in
``tmp_path``, points the data set's entry of :data:`SOURCES` at a fake mirror with the
fixtures' MD5s, and serves the bytes through an injected ``fetch``.  What is checked is
what a user relies on: the files land where the real loaders find them, a bad download
or an unsafe archive leaves nothing behind, and nothing is fetched without
``allow=True``.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import math
import tarfile
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from robust_pfl import api
from robust_pfl.cli import build_parser, main
from robust_pfl.config import load_config, parse_config
from robust_pfl.engine.datasets import (
    DATA_ENV_VAR,
    DatasetError,
    DownloadRefused,
    download_dataset,
    load_dataset,
)
from robust_pfl.engine.datasets import download as download_module
from robust_pfl.engine.datasets.cifar import CIFAR10_SUBDIR, CIFAR100_SUBDIR
from robust_pfl.engine.datasets.download import SOURCES, Checksum
from robust_pfl.engine.datasets.idx import IDX_FILES
from robust_pfl.experiments import build_task, validate
from test_datasets import (  # the loader tests' fixture writers
    FakeFetch,
    assert_matches,
    cifar_batch,
    idx_bytes,
    mnist_arrays,
    write_batch,
    write_cifar10,
    write_cifar100,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "cifar10_dirichlet.toml"
MIRROR = "https://mirror.example/data/"
DATASETS = tuple(SOURCES)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def serve(monkeypatch: pytest.MonkeyPatch, dataset: str, files: dict[str, bytes],
          served: dict[str, bytes] | None = None) -> FakeFetch:
    """Point ``SOURCES[dataset]`` at :data:`MIRROR` with the MD5s of ``files``, and return
    a fetch serving ``served`` (default: ``files``) from there."""
    checksums = {name: Checksum(md5(data)) for name, data in files.items()}
    source = dataclasses.replace(SOURCES[dataset], mirrors=(MIRROR,), checksums=checksums)
    monkeypatch.setitem(SOURCES, dataset, source)
    return FakeFetch({MIRROR + name: data for name, data in (served or files).items()})


def idx_archives(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """The four ``.gz`` files of an MNIST-like data set, as its mirrors serve them."""
    return {base + ".gz": gzip.compress(idx_bytes(arrays[role]), mtime=0) for role, base in IDX_FILES.items()}


CIFAR = {  # dataset -> (archive, folder inside it, meta file, writer of the batches)
    "cifar10": ("cifar-10-python.tar.gz", CIFAR10_SUBDIR, "batches.meta", write_cifar10),
    "cifar100": ("cifar-100-python.tar.gz", CIFAR100_SUBDIR, "meta", write_cifar100),
}


def tar_gz(folder: Path, arcname: str, extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    """``folder`` (its directory entry and files) under ``arcname``, plus ``extra``
    members with empty bodies, as a gzipped tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(folder, arcname=arcname)
        for member in extra:
            archive.addfile(member, io.BytesIO(b"") if member.isfile() else None)
    return buffer.getvalue()


def cifar_archive(tmp_path: Path, dataset: str, *, drop: str | None = None,
                  extra: tuple[tarfile.TarInfo, ...] = ()) -> tuple[str, bytes, dict[str, dict]]:
    """``(archive name, archive bytes, batches)`` of a small CIFAR archive laid out as
    the real one (``cifar-10-batches-py/data_batch_1`` ... with ``batches.meta``;
    ``cifar-100-python/train``, ``test`` and ``meta``); ``drop`` leaves a batch out."""
    name, folder, meta, write = CIFAR[dataset]
    source = tmp_path / "archive-source" / folder
    batches = write(source)
    write_batch(source / meta, {b"label_names": [b"class"] * 10} if dataset == "cifar10"
                else {b"fine_label_names": [b"fine"] * 100, b"coarse_label_names": [b"coarse"] * 20})
    if drop is not None:
        (source / drop).unlink()
    return name, tar_gz(source, folder, extra), batches


def served_files(tmp_path: Path, dataset: str) -> dict[str, bytes]:
    """What the mirrors of ``dataset`` serve, in its real format."""
    if dataset in CIFAR:
        name, archive, _ = cifar_archive(tmp_path, dataset)
        return {name: archive}
    return idx_archives(mnist_arrays())


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_idx_download_writes_the_files_the_loader_reads(tmp_path, monkeypatch, dataset):
    arrays = mnist_arrays()
    files = idx_archives(arrays)
    fetch = serve(monkeypatch, dataset, files)
    dest = download_dataset(dataset, tmp_path / dataset, allow=True, fetch=fetch)
    assert fetch.calls == [MIRROR + name for name in files]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == files  # nothing else, no temporaries
    data = load_dataset(dataset, dest)
    assert_matches(data, arrays)  # [n, 1, 28, 28] images and labels as written
    assert data.name == dataset


@pytest.mark.parametrize(("dataset", "options", "label_key", "classes"), [
    ("cifar10", {}, b"labels", 10),
    ("cifar100", {"label_kind": "fine"}, b"fine_labels", 100),
    ("cifar100", {"label_kind": "coarse"}, b"coarse_labels", 20),
])
def test_cifar_download_unpacks_into_the_loaders_layout(tmp_path, monkeypatch, dataset, options, label_key, classes):
    name, archive, batches = cifar_archive(tmp_path, dataset)
    fetch = serve(monkeypatch, dataset, {name: archive})
    dest = download_dataset(dataset, tmp_path / "data", allow=True, fetch=fetch)
    folder, meta = CIFAR[dataset][1], CIFAR[dataset][2]
    assert sorted(p.name for p in dest.iterdir()) == sorted([name, folder])  # no scratch folder left
    assert (dest / name).read_bytes() == archive  # kept, so that a second call need not fetch it
    assert sorted(p.name for p in (dest / folder).iterdir()) == sorted([*batches, meta])
    data = load_dataset(dataset, dest, **options)
    train = [batch for key, batch in batches.items() if key not in ("test", "test_batch")]
    test = batches["test_batch" if dataset == "cifar10" else "test"]
    expected = np.concatenate([b[b"data"] for b in train]).reshape(-1, 3, 32, 32)
    assert data.train_images.shape == expected.shape and data.test_images.shape[1:] == (3, 32, 32)
    assert torch.equal(data.train_images, torch.from_numpy(expected.astype(np.float32) / 255))
    assert data.train_labels.tolist() == sum((b[label_key] for b in train), [])
    assert data.test_labels.tolist() == test[label_key]
    assert data.num_classes == classes


def test_a_kept_archive_is_unpacked_again_without_fetching(tmp_path, monkeypatch):
    name, archive, _ = cifar_archive(tmp_path, "cifar10")
    dest = download_dataset("cifar10", tmp_path / "data", allow=True, fetch=serve(monkeypatch, "cifar10", {name: archive}))
    batch = dest / CIFAR10_SUBDIR / "test_batch"
    original = batch.read_bytes()
    batch.unlink()
    offline = FakeFetch({})  # any fetch would fail
    download_dataset("cifar10", dest, allow=True, fetch=offline)
    assert batch.read_bytes() == original and offline.calls == []
    download_dataset("cifar10", dest, allow=True, fetch=offline)  # everything there: nothing to do
    assert offline.calls == []


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("dataset", DATASETS)
def test_download_without_allow_is_refused(tmp_path, monkeypatch, dataset):
    fetch = serve(monkeypatch, dataset, served_files(tmp_path, dataset))
    with pytest.raises(DownloadRefused, match=r"allow=True.*robust-pfl download"):
        download_dataset(dataset, tmp_path / "dest", fetch=fetch)
    assert fetch.calls == [] and not (tmp_path / "dest").exists()


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_checksum_mismatch_leaves_nothing_behind(tmp_path, monkeypatch, dataset):
    files = served_files(tmp_path, dataset)
    tampered = {name: data[:-1] + bytes([data[-1] ^ 1]) for name, data in files.items()}
    fetch = serve(monkeypatch, dataset, files, served=tampered)
    expected = next(iter(files.values()))
    with pytest.raises(DatasetError, match="checksum mismatch") as caught:
        download_dataset(dataset, tmp_path / "new" / dataset, allow=True, fetch=fetch)
    message = str(caught.value)
    assert md5(expected) in message and "by hand" in message and "data_dir" in message
    assert not (tmp_path / "new" / dataset).exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(DatasetError, match="checksum mismatch"):
        download_dataset(dataset, existing, allow=True, fetch=fetch)
    assert list(existing.iterdir()) == []  # no file, no temporary, no scratch folder


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, link
    return member


UNSAFE = {  # case -> (member, what the error says)
    "parent": (lambda tmp: _member("../escape.txt"), "'..' component"),
    "nested parent": (lambda tmp: _member(f"{CIFAR10_SUBDIR}/../../escape.txt"), "'..' component"),
    "absolute": (lambda tmp: _member(str(tmp / "absolute.txt")), "absolute path"),
    "symlink": (lambda tmp: _member(f"{CIFAR10_SUBDIR}/link", tarfile.SYMTYPE, "/etc/passwd"), "neither a regular"),
    "hard link": (lambda tmp: _member(f"{CIFAR10_SUBDIR}/hard", tarfile.LNKTYPE, "/etc/passwd"), "neither a regular"),
    "device": (lambda tmp: _member(f"{CIFAR10_SUBDIR}/tty", tarfile.CHRTYPE), "neither a regular"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_an_archive_with_an_unsafe_member_is_refused(tmp_path, monkeypatch, case):
    make, fragment = UNSAFE[case]
    member = make(tmp_path)
    name, archive, _ = cifar_archive(tmp_path, "cifar10", extra=(member,))
    fetch = serve(monkeypatch, "cifar10", {name: archive})  # the checksum matches: only the member is wrong
    dest = tmp_path / "dest" / "cifar10"
    with pytest.raises(DatasetError, match="refusing to unpack") as caught:
        download_dataset("cifar10", dest, allow=True, fetch=fetch)
    assert fragment in str(caught.value) and repr(member.name) in str(caught.value)
    assert not dest.exists()  # neither the archive nor any of its members was written
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "dest" / "escape.txt").exists()
    assert not (tmp_path / "absolute.txt").exists()


def test_an_archive_without_a_batch_the_loader_reads_is_refused(tmp_path, monkeypatch):
    name, archive, _ = cifar_archive(tmp_path, "cifar10", drop="test_batch")
    fetch = serve(monkeypatch, "cifar10", {name: archive})
    with pytest.raises(DatasetError, match=f"lacks {CIFAR10_SUBDIR}/test_batch"):
        download_dataset("cifar10", tmp_path / "dest", allow=True, fetch=fetch)
    assert not (tmp_path / "dest").exists()


def test_unknown_dataset_names_the_downloads(tmp_path):
    with pytest.raises(DatasetError, match="allowed: mnist, fashion_mnist, cifar10, cifar100"):
        download_dataset("svhn", tmp_path, allow=True, fetch=FakeFetch({}))


# ----------------------------------------------------------------------------- command line


def test_the_command_accepts_exactly_the_downloadable_datasets():
    parser = build_parser()
    for dataset in SOURCES:
        assert parser.parse_args(["download", dataset, "DIR"]).dataset == dataset
    with pytest.raises(SystemExit):
        parser.parse_args(["download", "digits", "DIR"])  # bundled with scikit-learn: nothing to fetch


def test_the_command_downloads_and_its_advice_finds_the_data(tmp_path, monkeypatch, capsys):
    name, archive, batches = cifar_archive(tmp_path, "cifar10")
    monkeypatch.setattr(download_module, "_urllib_fetch", serve(monkeypatch, "cifar10", {name: archive}))
    dest = tmp_path / "data" / "cifar10"
    assert main(["download", "cifar10", str(dest)]) == 0
    printed = capsys.readouterr().out
    assert f'data_dir = "{dest}"' in printed and f"{DATA_ENV_VAR}={tmp_path / 'data'}" in printed
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "data"))  # the advice, followed
    assert load_dataset("cifar10").test_labels.tolist() == batches["test_batch"][b"labels"]


def test_the_command_reports_a_failed_download(tmp_path, monkeypatch, capsys):
    name, archive, _ = cifar_archive(tmp_path, "cifar10")
    fetch = serve(monkeypatch, "cifar10", {name: archive}, served={name: b"not the archive"})
    monkeypatch.setattr(download_module, "_urllib_fetch", fetch)
    assert main(["download", "cifar10", str(tmp_path / "dest")]) == 1
    assert "checksum mismatch" in capsys.readouterr().err
    assert not (tmp_path / "dest").exists()


# ----------------------------------------------------------------------------- the CIFAR-10 example


def balanced_cifar10_archive(tmp_path: Path, train_per_label: int = 50, test_per_label: int = 20) -> tuple[str, bytes]:
    """A CIFAR-10 archive in the real layout whose splits hold every label equally often
    (so the Dirichlet deal below does not depend on random label counts)."""
    folder = tmp_path / "balanced" / CIFAR10_SUBDIR
    folder.mkdir(parents=True)
    per_batch = 10 * train_per_label // 5
    sizes = {f"data_batch_{i}": per_batch for i in range(1, 6)} | {"test_batch": 10 * test_per_label}
    for batch_name, size in sizes.items():
        batch = cifar_batch(size, {})
        batch[b"labels"] = [i % 10 for i in range(size)]
        write_batch(folder / batch_name, batch)
    return "cifar-10-python.tar.gz", tar_gz(folder, CIFAR10_SUBDIR)


def test_the_cifar10_example_is_what_the_docs_describe():
    config = load_config(EXAMPLE)  # validates every field
    task = config.task
    assert (task.dataset, task.kind, task.model["name"]) == ("cifar10", "dirichlet", "cnn")
    assert task.data_dir == "data/cifar10"  # where `robust-pfl download cifar10 data/cifar10` writes
    methods = {method.display: method for method in config.methods}
    assert [m.name for m in methods.values()] == ["fc", "mc", "global", "local"]
    assert methods["Global+median"].options()["aggregator"] == "median"
    assert config.attack.name == "alie" and config.byzantine.per_cluster == 1


def test_the_cifar10_example_runs_on_a_downloaded_tiny_cifar10(tmp_path, monkeypatch):
    # the documented workflow: download (a fixture archive through a fake mirror), then run
    name, archive = balanced_cifar10_archive(tmp_path)
    fetch = serve(monkeypatch, "cifar10", {name: archive})
    dest = download_dataset("cifar10", tmp_path / "data" / "cifar10", allow=True, fetch=fetch)
    data = tomllib.loads(EXAMPLE.read_text())
    validate(parse_config({**data, "task": data["task"] | {"data_dir": str(dest)}}, str(EXAMPLE)))  # as it is
    # shrunk to stay fast: 1 honest client per cluster, a narrower CNN, one round of FC
    data["task"] |= {"data_dir": str(dest), "clients_per_cluster": 1, "model": {"name": "cnn", "width": 4}}
    data |= {"rounds": 1, "eval_every": 1, "methods": data["methods"][:1]}
    config = validate(parse_config(data, str(EXAMPLE)))
    task = build_task(config, config.seeds[0])
    clients = 4 * 1 + 4  # K * clients_per_cluster honest, one Byzantine per cluster
    assert task.train.inputs.shape[0] == clients and task.train.inputs.shape[2:] == (3, 32, 32)
    assert torch.bincount(task.cluster_ids).tolist() == [2] * 4
    for split in (task.train, task.validation, task.test):  # docs/data.md: one label histogram per cluster
        counts = torch.nn.functional.one_hot(split.targets, 10).sum(1)  # [N, 10]
        for k in range(4):
            rows = counts[task.cluster_ids == k]
            assert (rows == rows[0]).all()
    frame = api.run(config, progress=False)
    assert set(frame["method"]) == {"FC"} and frame["round"].max() == 1
    accuracy = frame[frame["metric"] == "test_accuracy"]["value"]
    assert len(accuracy) > 0 and all(0.0 <= value <= 1.0 and math.isfinite(value) for value in accuracy)


def test_the_cifar10_examples_sizes_are_those_docs_data_md_gives():
    # CIFAR-10's label counts (5000 train and 1000 test images of each label) are all the
    # sizing reads, so no images are needed; the documented seed-0 sizes follow from them
    config = load_config(EXAMPLE)
    labels = SimpleNamespace(train_labels=torch.arange(50000) % 10, test_labels=torch.arange(10000) % 10,
                             num_classes=10, name="cifar10")
    sizes = config.task.builder()._fitted_sizes(0, config.byzantine.placement(), labels, config.task.clients_per_cluster)
    assert sizes == (477, 53, 105)  # train, validation, test images per client
