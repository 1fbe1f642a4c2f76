"""Loading a benchmark file: its TOML parsed, every part checked whichever profile
runs (:mod:`robust_pfl.worst_case.checks`), then narrowed by the profile that runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from robust_pfl.config import ConfigError, check_nesting, read_toml_file
from robust_pfl.plugins import with_resolved_paths
from robust_pfl.worst_case.checks import check_file
from robust_pfl.worst_case.spec import BenchmarkSpec


def parse_benchmark(data: dict[str, Any], source: str = "<dict>", base_dir: Path | None = None,
                    quick: bool = False, subset: str | None = None, tune: bool | None = None) -> BenchmarkSpec:
    """A benchmark file's parsed TOML as a :class:`BenchmarkSpec`, every part checked
    whichever profile runs (:func:`robust_pfl.worst_case.checks.check_file`), then
    narrowed by its quick profile (``quick``) or subset ``subset``; ``tune = False``
    keeps the file's values (``--no-tune``).

    Raises:
        ConfigError: ``invalid config <source>:`` and a line per bad field.
    """
    check_nesting(data, f"benchmark {source}")
    return profile_of(check_file(with_resolved_paths(copy.deepcopy(data), base_dir), source), quick, subset, tune)


def profile_of(spec: BenchmarkSpec, quick: bool = False, subset: str | None = None,
               tune: bool | None = None) -> BenchmarkSpec:
    """The file's checked ``spec`` narrowed by its quick profile (``quick``) or subset
    ``subset``, with ``tune`` (``--no-tune``: ``False``) where given."""
    source = spec.source
    if quick and subset is not None:
        raise ConfigError("give --quick or --subset, not both")
    if quick:
        spec = spec.narrowed(spec.benchmark.quick, "benchmark.quick")
    elif subset is not None:
        if subset not in spec.benchmark.subsets:
            raise ConfigError(f"--subset {subset!r}: the file {source} defines {sorted(spec.benchmark.subsets)} "
                              "(tables [benchmark.subsets.<name>])")
        spec = spec.narrowed(spec.benchmark.subsets[subset], f"benchmark.subsets.{subset}")
    if tune is not None:
        spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"tune": tune})})
    return spec


def load_benchmark(path: str | Path, quick: bool = False, subset: str | None = None,
                   tune: bool | None = None) -> BenchmarkSpec:
    """The benchmark file at ``path`` (:func:`parse_benchmark`)."""
    return parse_benchmark(read_toml_file(path, "benchmark"), str(path), Path(path).parent, quick, subset, tune)
