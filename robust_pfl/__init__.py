"""robust-pfl: a testbed for Byzantine robustness in personalised federated learning.

The core (this package) is the simulated federation everything plugs into: stacked
client parameters and data, batched per-client gradients, seeded streams, and one
attack injection point.  ``attacks`` and ``defenses`` build on it; the composition
root (:mod:`robust_pfl.cli`, :mod:`robust_pfl.experiments`) wires them together.
"""

# First, before torch: a grid's pool worker dies with its grid (robust_pfl.parent_death).
from robust_pfl.parent_death import arm_from_environment as _arm_worker

_arm_worker()

from robust_pfl.engine.data import Batch, ClientData  # noqa: E402
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.objectives import (
    DenseNetwork,
    Objective,
    ScalarFunctions,
    linear_regression,
    logistic_regression,
    mlp,
)
from robust_pfl.engine.types import AttackBase, AttackContext, BackdoorAttack, RoundRecord

from robust_pfl.version import __version__


def run(config, **options):
    """Run an experiment and return its rows as a ``pandas.DataFrame``:
    :func:`robust_pfl.api.run` (imported on first use: the core does not import
    ``attacks`` and ``defenses`` itself)."""
    from robust_pfl import api

    return api.run(config, **options)


def run_grid(grid, **options):
    """Run a grid and return its finished cells' rows: :func:`robust_pfl.api.run_grid`."""
    from robust_pfl import api

    return api.run_grid(grid, **options)


def benchmark(source, **options):
    """Run a worst-case benchmark and return its result: :func:`robust_pfl.api.benchmark`."""
    from robust_pfl import api

    return api.benchmark(source, **options)


__all__ = [
    "Batch",
    "ClientData",
    "Federation",
    "Objective",
    "DenseNetwork",
    "ScalarFunctions",
    "linear_regression",
    "logistic_regression",
    "mlp",
    "AttackBase",
    "BackdoorAttack",
    "AttackContext",
    "RoundRecord",
    "run",
    "run_grid",
    "benchmark",
]
