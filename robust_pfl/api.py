"""Python entry points for notebooks and scripts: run an experiment or a grid from a
dict, a TOML file or a validated config and get the results as a tidy
``pandas.DataFrame``, with a progress bar in a terminal or a Jupyter notebook.

An attack, aggregator or algorithm registered in the same process (``@attacks.register``
on a class of your own, ``defenses.register``, ...) can be named in the config like
the package's own (docs/extending.md).  A dict config's relative ``.py`` plug-in paths
resolve against the working directory (a TOML file's against its directory).

:func:`run` runs on torch's thread count as it stands: set it with
``torch.set_num_threads(n)`` before the call (the command line's ``--threads`` and its
``auto`` policy apply to commands only; a grid's cells run on its ``[resources] cpus``;
results are bit-identical across counts).  docs/python.md shows the frame and a run.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Mapping

import pandas

from robust_pfl.config import ExperimentConfig

ConfigLike = ExperimentConfig | Mapping[str, Any] | str | Path
#: The columns of :func:`run`'s frame: one row per method, seed, evaluated round and metric.
RUN_COLUMNS = ("method", "seed", "round", "metric", "value")


def experiment_config(config: ConfigLike, device: str | None = None) -> ExperimentConfig:
    """``config`` as a validated run config: a dict (the TOML's structure) or the path
    of a TOML run file, checked in full (:func:`robust_pfl.experiments.parse_and_validate`),
    or an :class:`ExperimentConfig`, returned as it is.  Raises
    :class:`~robust_pfl.config.ConfigError` naming every bad field, of every stage of
    the checks at once."""
    from robust_pfl.experiments import load_and_validate, parse_and_validate

    if isinstance(config, ExperimentConfig):
        return config
    if isinstance(config, (str, Path)):
        return load_and_validate(config, device=device)
    data = dict(config)
    if device is not None:
        data["device"] = device
    return parse_and_validate(data)


def run(config: ConfigLike, *, out_dir: str | Path | None = None, progress: bool | None = None,
        resume: bool = False) -> pandas.DataFrame:
    """Run an experiment (every method, every seed) and return its rows.

    Args:
        config: a dict with the TOML run file's structure, a TOML path, or an
            :class:`ExperimentConfig`.
        out_dir: also write ``history.csv`` and ``summary.json`` there (and the
            checkpoints, with ``checkpoint_every``), as ``robust-pfl run --out`` does.
        progress: a progress bar (default: in a terminal or a Jupyter kernel).
        resume: continue from ``out_dir``'s checkpoints.

    Returns:
        A frame with columns :data:`RUN_COLUMNS` (``history.csv``'s): one row per
        method (its ``label``, default its name), seed, evaluated round (0: before
        training) and metric (docs/config.md, "Data and metrics").  Accuracies are
        fractions in [0, 1] here (``robust-pfl results`` shows them in percent).  There
        is no ``attack`` column: the attack is the config's one (``run_grid``'s frame
        has one where the grid sweeps it); add it with ``frame.assign(attack=...)``
        before concatenating runs.  ``frame.pivot_table(index="round",
        columns="method", values="value")`` on one metric gives its curves.
    """
    from robust_pfl.experiments import run_experiment, run_table, validate
    from robust_pfl.engine.results import ResultTable

    parsed = validate(config) if isinstance(config, ExperimentConfig) else experiment_config(config)
    if out_dir is None:
        table: ResultTable = run_table(parsed, None, progress, resume, validated=True)
        return pandas.DataFrame(table.rows, columns=list(RUN_COLUMNS))
    run_experiment(parsed, Path(out_dir), progress, resume, validated=True)
    return pandas.read_csv(Path(out_dir) / "history.csv")


def run_grid(grid: Mapping[str, Any] | str | Path, *, out_dir: str | Path | None = None,
             progress: bool | None = None) -> pandas.DataFrame:
    """Run a grid (a dict with a grid file's structure, or its path) cell by cell in
    this process and return the finished cells' rows, one column per grid axis.

    ``out_dir`` is the grid's store: cells already finished there are not run again
    (as ``robust-pfl grid --out``); without it a temporary directory is used and
    removed afterwards."""
    from robust_pfl.grid import grid_results
    from robust_pfl.grid import run_grid as run_cells
    from robust_pfl.grid_file import expand_grid, load_grid

    expanded = load_grid(grid) if isinstance(grid, (str, Path)) else expand_grid(dict(grid), "<dict>")
    if out_dir is not None:
        run_cells(expanded, Path(out_dir), progress=progress)
        return grid_results(Path(out_dir), expanded)
    with tempfile.TemporaryDirectory(prefix="robust-pfl-grid-") as scratch:
        run_cells(expanded, Path(scratch), progress=progress)
        return grid_results(Path(scratch), expanded)


def benchmark(source: Mapping[str, Any] | str | Path, *, out_dir: str | Path | None = None, quick: bool = False,
              subset: str | None = None, tune: bool | None = None, jobs: int = 1, backend: str = "local",
              device: str | None = None, progress: bool | None = None, page: str | Path | None = None,
              data_dir: str | Path | None = None):
    """Run a worst-case benchmark (a benchmark file's path, or a dict with its
    structure) and return its :class:`~robust_pfl.worst_case.BenchmarkResult`: the
    worst-case table (``result.table``), breakdowns, backdoors, best defenses and the
    tuned settings, as ``robust-pfl benchmark`` writes them.

    ``out_dir`` is the benchmark's store (finished cells are not run again); without
    it a temporary directory is used.  ``quick``/``subset`` pick the file's profiles,
    ``tune = False`` keeps the file's values, ``jobs``/``backend`` run the cells in
    parallel (``"local"`` processes or ``"ray"``), ``page`` writes the results page,
    ``data_dir`` sets the data set's directory (``task.data_dir``)."""
    from robust_pfl.backends import make_backend
    from robust_pfl.worst_case import run_benchmark

    with contextlib.ExitStack() as stack:
        if out_dir is None:
            out_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="robust-pfl-benchmark-"))
        cells = make_backend(backend, jobs=jobs)
        stack.callback(cells.close)
        return run_benchmark(source, Path(out_dir), quick=quick, subset=subset, tune=tune, backend=cells,
                             device=device, progress=progress, page=page, workers=jobs,
                             data_dir=None if data_dir is None else str(data_dir))
