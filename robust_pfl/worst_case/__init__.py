"""Worst-case robustness benchmarks (``robust-pfl benchmark``): every defense against
the whole attack catalogue, across Byzantine fractions and heterogeneity levels, with
hyperparameters tuned on validation data and intervals over seeds.

* :mod:`~robust_pfl.worst_case.spec`: the benchmark file, validated at load.
* :mod:`~robust_pfl.worst_case.plan`: its cells, keyed as grid cells.
* :mod:`~robust_pfl.worst_case.analysis`: tuning, worst case, breakdown, best defense.
* :mod:`~robust_pfl.worst_case.report` and :mod:`~robust_pfl.worst_case.figures`:
  tables, page and figures.
* :mod:`~robust_pfl.worst_case.runner`: :func:`run_benchmark`.
"""

from robust_pfl.worst_case.runner import BenchmarkResult, run_benchmark
from robust_pfl.worst_case.loading import load_benchmark, parse_benchmark
from robust_pfl.worst_case.spec import BenchmarkSpec

__all__ = ["BenchmarkResult", "BenchmarkSpec", "load_benchmark", "parse_benchmark", "run_benchmark"]
