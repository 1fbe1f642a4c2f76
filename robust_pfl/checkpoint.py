"""A run's checkpoint identity: the fingerprint that ties a checkpoint to one config,
method and seed, and its file name.  Writing and reading checkpoint files is
:mod:`robust_pfl.engine.pickling`'s (shared with the conformance checks)."""

from __future__ import annotations

import hashlib
import json
import re

from robust_pfl.config import ExperimentConfig, MethodConfig
from robust_pfl.engine.pickling import FORMAT_VERSION

#: Config fields that never change a run's trajectory: the method and seed are given
#: on their own, and the checkpoint interval only decides when the state is written.
_NOT_FINGERPRINTED = {"methods", "seeds", "checkpoint_every"}


def fingerprint(config: ExperimentConfig, method: MethodConfig, seed: int) -> str:
    """sha256 of everything that decides a run's trajectory: the resolved config (less
    :data:`_NOT_FINGERPRINTED`), the method with its options, the seed and
    :data:`FORMAT_VERSION`."""
    payload = {
        "format": FORMAT_VERSION,
        "config": config.model_dump(mode="json", exclude=_NOT_FINGERPRINTED),
        "method": method.model_dump(mode="json"),
        "seed": seed,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def checkpoint_name(label: str, seed: int) -> str:
    """``<label>-seed<seed>.pt`` with the label made a safe file name: characters other
    than letters, digits, ``.``, ``_`` and ``-`` become ``_`` (and leading dots go), and
    a label so changed gets 8 hex digits of its sha256, so distinct labels never share
    a file."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", label).lstrip(".")
    if safe != label:
        safe = f"{safe}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"
    return f"{safe}-seed{seed}.pt"
