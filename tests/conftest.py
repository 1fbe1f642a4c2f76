"""Shared fixtures for the test suite (kept small)."""

from __future__ import annotations

from robust_pfl.engine.types import AttackBase

import pytest
import torch


#: The default run's longest tests (15 s or more each on the 2-core CI machine, from
#: ``pytest --durations``): collected first, so that
#: pytest-xdist starts them while the short tests fill in around them, rather than
#: leaving one worker with a long test while the other has finished.
LONG_TESTS = (
    "test_flower.py::test_a_few_flower_rounds_give_the_simulator_honest_models",
    "test_benchmark_racing.py::test_racing_names_the_same_worst_attack_and_verdict_as_the_full_factorial",
    "test_worst_case.py::test_a_killed_benchmark_resumes_without_recomputing_a_finished_cell",
    "test_optimised_search.py::test_the_warm_started_search_stays_at_least_as_damaging_as_byzfl",
    "test_optimised_search.py::test_at_least_as_damaging_as_byzfl_search_in_95_percent_of_cases",
    "test_checkpoint.py::test_sigkilled_run_resumes_to_the_uninterrupted_result",
    "test_theory_mutation.py::",
    "test_threads_progress.py::test_a_run_is_bit_identical_at_one_and_two_threads",
    "test_api.py::test_the_readmes_python_example_runs_as_written",
    "test_plugin_grid.py::",
    "test_ray_backend.py::",
    "test_cfl.py::test_fc_never_mixes_clients_with_different_optima_on_the_example",
    "test_plugins.py::test_a_grid_file_names_a_plugin_attack",
    "test_grid.py::test_local_backend_with_two_processes_gives_the_same_results",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move :data:`LONG_TESTS` to the front, keeping every other test's order."""
    items.sort(key=lambda item: not any(name in item.nodeid for name in LONG_TESTS))


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tiny-tensor tests on one intra-op thread, then restore.

    On a loaded 2-core machine, reductions that return indices (``Tensor.min(dim)``,
    ``Tensor.max(dim)``) on tiny tensors take ~10 ms each with 2 threads versus ~10 us
    with one; the property tests call them thousands of times.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class CallPathAttack(AttackBase):
    """Wraps an attack so that engines take the plain call path: no ``write_rows``,
    and ``reads_messages`` as given (``True`` makes engines compute every row)."""

    def __init__(self, inner, reads_messages: bool) -> None:
        self.inner = inner
        self.reads_messages = reads_messages

    def __call__(self, messages, context):
        return self.inner(messages, context)


@pytest.fixture
def call_path_attack():
    """The :class:`CallPathAttack` wrapper, for tests comparing engine shortcuts with
    the plain path."""
    return CallPathAttack


@pytest.fixture(scope="session")
def separated_mc_study():
    """MC on the one-sided separated family (theory_checks.scaling_separated), four
    horizons and two repeats: measured once, read by the family's tests and the
    mutation tests."""
    from theory_checks.scaling_separated import separated_rate_study
    from theory_checks.separated_instance import SeparatedSizes

    return separated_rate_study("mc", sizes=SeparatedSizes(horizons=(64, 128, 256, 512), repeats=2))
