"""Every algorithm, aggregator and attack, a checkpoint round trip and a two-cell grid
on a CUDA device (marker ``cuda``), each test also run on the CPU so that its logic is
checked wherever the suite runs.  The CUDA cases are reported as skipped, with the
reason, on a machine without CUDA; ``python -m pytest -m cuda`` runs them on a GPU.

On CUDA each case runs with :func:`robust_pfl.engine.seeding.deterministic_kernels_within`
(as every run does) and must raise no warning: an op without a deterministic CUDA
kernel warns there, and the quick start must print none."""

from __future__ import annotations

import json
import math
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import torch

import attacks
import defenses
from robust_pfl.cli import main
from robust_pfl.engine.devices import engine, same_device
from robust_pfl.engine.federation import Federation
from robust_pfl.grid import read_results, run_grid
from robust_pfl.grid_file import load_grid
from robust_pfl.engine.seeding import deterministic_kernels_within
from robust_pfl.engine.types import AttackContext
from test_checkpoint import config_of, exact, resumed, uninterrupted
from test_defense_conformance import HOSTILE, METHODS, build_method, make_task, options_for

ROOT = Path(__file__).resolve().parents[1]
CUDA_AVAILABLE = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"
ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not CUDA_AVAILABLE, reason=NO_CUDA)]
DEVICES = ["cpu", pytest.param("cuda", marks=ON_CUDA)]
ROUNDS = 4


@contextmanager
def strict_run(device: str) -> Iterator[None]:
    """Deterministic kernels as a run sets them, and any warning an error."""
    with deterministic_kernels_within(device), warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def federation_on(device: str, method: str, seed: int = 0, attack=None, dtype=torch.float64,
                  batch_size: int | None = 4) -> Federation:
    """The conformance suite's federation (``make_task``) on ``device``; its
    generators are made on the plain device name, as a config's ``"cuda"`` makes them."""
    task = make_task(seed, dtype=dtype, method=method)
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, batch_size, attack,
                      device=torch.device(device), num_classes=task.num_classes)


def trained(device: str, method: str, seed: int = 0, attack=None, dtype=torch.float64, rounds: int = ROUNDS,
            batch_size: int | None = 4):
    fed = federation_on(device, method, seed, attack, dtype, batch_size)
    algorithm = build_method(method, fed, options_for(method))
    with strict_run(device):
        records = [algorithm.step(t) for t in range(rounds)]
    return fed, algorithm, records


# -- algorithms and aggregators ----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", METHODS)
def test_every_method_runs_on_the_device_deterministically(name, device):
    fed, algorithm, records = trained(device, name, attack=attacks.LargeGradient())
    models = algorithm.client_models()
    assert same_device(models.device, device)
    assert models.shape == (fed.clients, fed.objective.dim)
    assert torch.isfinite(models[fed.honest]).all()
    for record in records:
        for value in (record.gradients, record.updates, record.centres, record.assignment):
            assert value is None or same_device(value.device, device)
    _, again, _ = trained(device, name, attack=attacks.LargeGradient())
    assert torch.equal(models, again.client_models()), "same seed, same device: results must be bit-identical"


# Methods whose steps take no data-dependent branch that rounding could flip: on CUDA
# they must match the CPU's float64 results to rounding, given the same draws.  A CUDA
# generator draws other numbers than the CPU's from the same seed, so the runs take
# full batches under bit flip (which draws nothing).
BRANCH_FREE = ["local", "global", "ground_truth", "global:median", "global:trimmed_mean"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [m for m in BRANCH_FREE if m in METHODS])
def test_branch_free_methods_match_the_cpu(name, device):
    _, on_device, _ = trained(device, name, attack=attacks.build("bit_flip"), batch_size=None)
    _, on_cpu, _ = trained("cpu", name, attack=attacks.build("bit_flip"), batch_size=None)
    assert torch.allclose(on_device.client_models().cpu(), on_cpu.client_models(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("name", METHODS)
def test_hostile_rows_never_reach_honest_models_on_the_device(name, hostile, device):
    fed, algorithm, _ = trained(device, name, attack=HOSTILE[hostile](), dtype=torch.float32, rounds=5)
    assert torch.isfinite(algorithm.client_models()[fed.honest]).all(), f"{name} under {hostile} on {device}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(defenses.AGGREGATORS))
def test_every_aggregator_on_the_device_matches_the_cpu(name, device):
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(12, 40, generator=generator, dtype=torch.float64)
    rows[3] = math.nan
    rows[7] = 1e300
    aggregator = defenses.make_aggregator(name)
    with strict_run(device):
        on_device = aggregator(rows.to(device))
    assert same_device(on_device.device, device)
    expected = aggregator(rows)
    assert torch.equal(torch.isfinite(on_device.cpu()), torch.isfinite(expected))
    assert torch.allclose(on_device.cpu(), expected, rtol=1e-7, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_fc_budget_and_evaluation_follow_the_device(device):
    fed = federation_on(device, "fc")
    fc = defenses.build("fc", fed, options_for("fc"))
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        assert fc.budget_mb >= max(1024, int(0.2 * free) >> 20)
        assert engine(device) == "batched"
    else:
        assert fc.budget_mb == 1024 and engine(device) == "blocked"
    # 250 senders of a large model: the Gram matrix on an accelerator, kept products on the CPU
    expected = "pairwise" if engine(device) == "batched" else "gram"
    assert fc.params.distance_method(torch.empty(3, 250, 2000, device=device)) == expected


# -- attacks -----------------------------------------------------------------------------------

ATTACKS = sorted(name for name in attacks.REGISTRY if "data" not in attacks.REGISTRY[name].needs)


def attack_context(device: str, seed: int, byzantine: torch.Tensor) -> AttackContext:
    generator = torch.Generator(device=torch.device(device).type)  # "cuda", as a federation makes it
    generator.manual_seed(seed)
    return AttackContext(
        round_index=0, kind="gradient", byzantine=byzantine.to(device),
        cluster_ids=torch.zeros(byzantine.shape[0], dtype=torch.long, device=device),
        generator=generator, senders=None, defense_state={},
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ATTACKS)
def test_every_attack_on_the_device(name, device):
    attack = attacks.build(name)
    byzantine = torch.tensor([False, True, False, False, True, False, False])
    values = torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device)
    original = values.clone()
    with strict_run(device):
        first = attack(values, attack_context(device, 5, byzantine))
        second = attack(values, attack_context(device, 5, byzantine))
    assert torch.equal(values, original), "the attack mutated the messages"
    assert first.shape == (3, 2, 6) and first.dtype == values.dtype and same_device(first.device, device)
    assert torch.equal(first.nan_to_num(), second.nan_to_num()), "same seed, different rows"


@pytest.mark.parametrize("device", DEVICES)
def test_large_blocks_of_noise_are_drawn_on_the_device(device):
    """The Fig. 6 shape: one receiver's 50 Byzantine rows of the MLP, delivered into
    the workspace in place (the first CUDA round recursed here forever)."""
    byzantine = torch.zeros(250, dtype=torch.bool)
    byzantine[200:] = True
    messages = torch.zeros(2, 250, 20_000, device=device)
    fed_attack = attacks.LargeGradient()
    with strict_run(device):
        fed_attack.write_rows(messages[:, 200:], attack_context(device, 0, byzantine))
    rows = messages[:, 200:]
    assert torch.isfinite(rows).all() and abs(float(rows.mean()) - 1e6) < 10
    assert float(messages[:, :200].abs().max()) == 0


# -- the quick start, a checkpoint, a grid -----------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_AVAILABLE, reason=NO_CUDA)
def test_quick_start_on_cuda_is_reproducible_quiet_and_near_the_cpu(tmp_path):
    config = ROOT / "configs" / "quickstart.toml"
    outs = {name: tmp_path / name for name in ("cuda1", "cuda2", "cpu")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["run", str(config), "--device", "cuda", "--out", str(outs["cuda1"])]) == 0
    assert main(["run", str(config), "--device", "cuda", "--out", str(outs["cuda2"])]) == 0
    assert main(["run", str(config), "--device", "cpu", "--out", str(outs["cpu"])]) == 0
    history = (outs["cuda1"] / "history.csv").read_bytes()
    assert history == (outs["cuda2"] / "history.csv").read_bytes(), "two CUDA runs differ"
    finals = {name: json.loads((out / "summary.json").read_text())["final"] for name, out in outs.items()}
    for method, metrics in finals["cpu"].items():
        cpu = metrics["test_accuracy"]["mean"]
        cuda = finals["cuda1"][method]["test_accuracy"]["mean"]
        assert abs(cuda - cpu) <= 0.03, f"{method}: {cuda:.4f} on CUDA against {cpu:.4f} on the CPU"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", [{"name": "fc", "lr": 0.05, "heavy_ball": 0.9, "groups": 2},
                                    {"name": "mc", "lr": 0.05, "heavy_ball": 0.5}])
def test_checkpoint_round_trip_on_the_device(method, device, tmp_path, monkeypatch):
    config = config_of(method, {"name": "large_gradient"}, device=device)
    with deterministic_kernels_within(device):  # as a run sets them
        rows, models = uninterrupted(config, monkeypatch)
        assert same_device(models.device, device)
        assert exact(resumed(config, tmp_path / "run.pt", stops=(3, 4))) == exact(rows)


@pytest.mark.parametrize("device", DEVICES)
def test_two_cell_grid_on_the_device(device, tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(
        "rounds = 3\neval_every = 1\nseeds = [0, 1]\n"
        "[task]\nclusters = 2\nclients_per_cluster = 3\n"
        '[attack]\nname = "large_gradient"\n[byzantine]\ntotal = 1\n'
        '[[methods]]\nname = "fc"\nlr = 0.05\n'
    )
    grid = load_grid(path, device=device)
    assert len(grid.cells) == 2 and all(same_device(cell.config["device"], device) for cell in grid.cells)
    summary = run_grid(grid, tmp_path / "out")
    assert summary["ran"] == 2 and summary["errors"] == 0, summary["errored"]
    frame = read_results(tmp_path / "out")
    assert set(frame["status"]) == {"ok"} and frame["cell"].nunique() == 2
    assert run_grid(grid, tmp_path / "out")["skipped"] == 2


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_AVAILABLE, reason=NO_CUDA)
@pytest.mark.parametrize("label", ["ifca", "mc", "fc g=16"])
def test_launches_counted_on_the_cpu_are_the_devices(label, device="cuda"):
    """The launch counts the CI bounds (tests/test_launch_counts.py) are counted on the
    CPU with the batched engine; on the card the same step dispatches the same
    operators, up to the few device-specific branches (the CPU draws large blocks of
    noise in parts), within 5%.  (On the CPU it would compare the count with itself.)"""
    from robust_pfl.engine.devices import using_engine
    from robust_pfl.engine.launches import count_launches
    from test_launch_counts import METHODS as COUNTED, _federation, step_count

    name, options = COUNTED[label]
    federation = _federation(64)
    on_device = Federation(federation.objective, federation.train, federation.cluster_ids, federation.byzantine,
                           0, federation.batch_size, federation.attack, device=torch.device(device),
                           num_classes=federation.num_classes)
    algorithm = defenses.build(name, on_device, options)
    algorithm.snapshot_records = False
    with using_engine("batched"):
        algorithm.step(0)
        algorithm.step(1)
        _, count = count_launches(lambda: algorithm.step(2))
    reference = step_count(label, 64)
    assert abs(count.kernels - reference.kernels) <= 0.05 * reference.kernels
    assert abs(count.syncs - reference.syncs) <= 0.05 * reference.syncs + 2
