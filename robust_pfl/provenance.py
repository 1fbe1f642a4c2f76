"""Where a result came from: the ``provenance`` entry of ``summary.json`` and
``robust-pfl --version``.

:func:`provenance` records the package version, the git commit of the checkout the
package runs from (``None`` outside a git checkout, or where git is absent or slow),
the torch version, the device and torch threads, the wall time, the host, the Python
version and when the run finished (UTC, ISO 8601).
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from robust_pfl.version import __version__

#: How long ``git rev-parse`` may take before the commit is recorded as unknown.
GIT_TIMEOUT_S = 2.0
PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache
def git_commit(package_dir: Path = PACKAGE_DIR) -> str | None:
    """The commit (40 hex digits) checked out where the package lives, or ``None``:
    no git, not a checkout, a timeout, or a package installed inside some other
    repository (site-packages of a virtual environment in a project's checkout: the
    checkout's top level must be the directory holding the package)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(package_dir), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        return None
    top, commit = lines
    try:
        if Path(top).resolve() != package_dir.resolve().parent:
            return None
    except OSError:
        return None
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        return None
    return commit


@functools.cache
def git_dirty(package_dir: Path = PACKAGE_DIR) -> bool:
    """Whether the checkout :func:`git_commit` names has uncommitted changes to its
    tracked code or configs (``*.py``, ``*.toml``: then a result is not that commit's
    alone; a regenerated page or figure is not such a change); ``False`` where it
    cannot tell."""
    if git_commit(package_dir) is None:
        return False
    try:
        done = subprocess.run(
            ["git", "-C", str(package_dir.parent), "status", "--porcelain", "--untracked-files=no", "--", "*.py", "*.toml"],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def package_version() -> str:
    return __version__


def version_text() -> str:
    """What ``robust-pfl --version`` prints: the version, and the commit if known."""
    commit = git_commit()
    return f"robust-pfl {package_version()}" + (f" (commit {commit})" if commit else "")


def provenance(device: Any, threads: int | None, seconds: float) -> dict[str, Any]:
    """The ``provenance`` entry of a ``summary.json``: ``device`` (a name, or a list of
    names for a grid whose cells ran on several), the torch ``threads`` the work ran
    on, and its wall time ``seconds``."""
    import torch

    names = [device] if isinstance(device, str) else list(device or [])
    gpus = sorted({_cuda_name(name) for name in names if str(name).startswith("cuda")} - {None})
    return {
        "version": package_version(),
        "git_commit": git_commit(),
        "torch": str(torch.__version__),
        "device": device,
        "device_name": (gpus[0] if len(gpus) == 1 else gpus) if gpus else None,
        "torch_threads": threads,
        "wall_seconds": seconds,
        "host": socket.gethostname(),
        "machine": machine_text(),
        "python": platform.python_version(),
        "finished_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _cuda_name(device: str) -> str | None:
    """The GPU's model name of a CUDA device (``None`` where it cannot be read)."""
    import torch

    try:
        return torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else None
    except (RuntimeError, ValueError, AssertionError):
        return None


def machine_text() -> str:
    """This machine in words: its CPU model (where ``/proc/cpuinfo`` names it, else
    the platform's processor) and its logical CPU count."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} logical CPUs"
