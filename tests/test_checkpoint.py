"""Checkpointed runs (robust_pfl.checkpoint, run_method(checkpoint=...), ``run --resume``):
a run stopped at any round and resumed gives bit-identical rows and final models to
one that never stopped; a checkpoint belongs to one config, method and seed; a kill
during a save never leaves half a checkpoint.  Bits are compared only between runs made
in this process: the old checkpoints of ``tests/data``, written on another CPU, load
exactly and resume within :data:`FOREIGN_RELATIVE`."""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import pickletools
import random
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import defenses
from robust_pfl.checkpoint import checkpoint_name, fingerprint
from robust_pfl.engine import pickling as checkpoints
from robust_pfl.engine.pickling import CheckpointError, load_checkpoint, save_checkpoint
from robust_pfl.cli import main
from robust_pfl.config import ConfigError, load_config, parse_config
from robust_pfl.experiments import RunParts, load_run, run_experiment, run_method, validate

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("single_thread")


SYNTHETIC = {"name": "synthetic_linear", "clusters": 2, "clients_per_cluster": 4}
DIGITS = {
    "name": "image",
    "dataset": "digits",
    "kind": "private_label",
    "clusters": 2,
    "clients_per_cluster": 3,
    "model": {"name": "mlp", "hidden": [8]},
}


def config_of(method: dict[str, Any], attack: dict[str, Any], task: dict[str, Any] = SYNTHETIC, **extra: Any):
    data = {
        "seeds": [3],
        "rounds": 9,
        "eval_every": 2,
        "checkpoint_every": 2,
        "byzantine": {"total": 2},
        "task": task,
        "methods": [method],
        "attack": attack,
        **extra,
    }
    return validate(parse_config(data))


class Stop(Exception):
    """Raised from ``on_round``: the run dies after that round, before its checkpoint."""


def stop_after(rounds: int):
    count = [0]

    def on_round() -> None:
        count[0] += 1
        if count[0] == rounds:
            raise Stop

    return on_round


def exact(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows with every value as its exact hex form (NaN equals NaN)."""
    return [(row["method"], row["seed"], row["round"], row["metric"], float(row["value"]).hex()) for row in rows]


def uninterrupted(config, monkeypatch) -> tuple[list[dict[str, Any]], torch.Tensor]:
    """Rows and final models of a run without checkpoints (the algorithm caught as it is built)."""
    built = []
    real_build = defenses.build

    def build(*args: Any, **kwargs: Any):
        built.append(real_build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(defenses, "build", build)
    table = run_method(config.methods[0], config, config.seeds[0])
    monkeypatch.setattr(defenses, "build", real_build)
    return table.rows, built[0].client_models().clone()


# Each case: a method with state across rounds, and an attack drawing from its stream.
CASES = {
    "fc-heavy-ball-subgroups": ({"name": "fc", "lr": 0.05, "heavy_ball": 0.9, "groups": 2}, {"name": "large_gradient"}),
    "mc-ball-edge": ({"name": "mc", "lr": 0.05, "heavy_ball": 0.5}, {"name": "ball_edge"}),
    "mc-pairwise": ({"name": "mc", "lr": 0.05, "method": "pairwise"}, {"name": "large_gradient"}),
    "myopic": ({"name": "myopic", "lr": 0.05}, {"name": "gaussian_noise"}),
    "global-median-optimised": (
        {"name": "global", "lr": 0.05, "heavy_ball": 0.9, "aggregator": "median"},
        {"name": "optimised"},
    ),
    "global-bucketing": ({"name": "global", "lr": 0.05, "aggregator": {"name": "bucketing", "s": 2}}, {"name": "alie"}),
    # a warm-started search: the previous round's value lives in the federation's attack memory (a
    # resume that lost it would search afresh in round 2 and differ here)
    "global-geometric-median-optimal-ipm-warm": (
        {"name": "global", "lr": 0.05, "aggregator": "geometric_median"}, {"name": "optimal_ipm", "search_every": 3}),
    "ifca": ({"name": "ifca", "lr": 0.05, "heavy_ball": 0.5}, {"name": "large_gradient"}),
    "ditto": ({"name": "ditto", "lr": 0.05, "heavy_ball": 0.5}, {"name": "large_gradient"}),
    "local": ({"name": "local", "lr": 0.05, "heavy_ball": 0.9}, {"name": "none"}),
    "ground_truth": ({"name": "ground_truth", "lr": 0.05}, {"name": "large_gradient"}),
}


def resumed(config, path: Path, stops: tuple[int, ...]) -> list[dict[str, Any]]:
    """Rows of a run stopped after each of ``stops`` rounds (counted from its start or
    resumption) and resumed from ``path`` until it finishes."""
    method, seed = config.methods[0], config.seeds[0]
    for rounds in stops:
        with pytest.raises(Stop):
            run_method(method, config, seed, on_round=stop_after(rounds), checkpoint=path)
    return run_method(method, config, seed, checkpoint=path).rows


@pytest.mark.parametrize("case", sorted(CASES))
def test_stopped_and_resumed_run_is_bit_identical(case, tmp_path, monkeypatch):
    method, attack = CASES[case]
    config = config_of(method, attack)
    rows, models = uninterrupted(config, monkeypatch)
    path = tmp_path / "run.pt"
    # stopped mid-interval (3: one round past the checkpoint at 2) and on a checkpoint round
    assert exact(resumed(config, path, stops=(3, 4))) == exact(rows)
    saved = load_run(config.methods[0], config, config.seeds[0], path)
    assert saved.done == config.rounds
    assert torch.equal(saved.algorithm.client_models(), models)


@pytest.mark.parametrize("name", sorted(defenses.REGISTRY))
def test_every_registered_algorithm_resumes_bit_identically(name, tmp_path, monkeypatch):
    """With its default options, so that a newly registered algorithm is checked too."""
    classification = getattr(defenses.REGISTRY[name], "requires_classification", False)
    task = {**DIGITS} if classification else SYNTHETIC
    extra = {"batch_size": 32} if classification else {}
    config = config_of({"name": name}, {"name": "large_gradient"}, task, **extra)
    rows, models = uninterrupted(config, monkeypatch)
    path = tmp_path / "run.pt"
    assert exact(resumed(config, path, stops=(3,))) == exact(rows)
    assert torch.equal(load_run(config.methods[0], config, config.seeds[0], path).algorithm.client_models(), models)


@pytest.mark.parametrize(
    "method, attack, reshuffle",
    [
        ({"name": "knn_per", "lr": 0.1, "heavy_ball": 0.5}, {"name": "large_gradient"}, False),
        ({"name": "fc", "lr": 0.1, "heavy_ball": 0.9}, {"name": "label_flip"}, True),
        ({"name": "ifca_model_avg", "lr": 0.1}, {"name": "large_gradient"}, True),
    ],
)
def test_image_task_runs_resume_bit_identically(method, attack, reshuffle, tmp_path, monkeypatch):
    """Digits with batches of 32 of each client's 161 samples: an epoch is 6 rounds.
    With ``reshuffle_every_epoch`` the run resumes from the checkpoint at round 6 (the
    next round re-deals) and from the one at round 8 (the deal of epoch 1 must be
    rebuilt); a data attack poisons each new deal."""
    config = config_of(method, attack, {**DIGITS, "reshuffle_every_epoch": reshuffle}, batch_size=32, rounds=14)
    rows, models = uninterrupted(config, monkeypatch)
    path = tmp_path / "run.pt"
    assert exact(resumed(config, path, stops=(7, 3))) == exact(rows)
    assert torch.equal(load_run(config.methods[0], config, config.seeds[0], path).algorithm.client_models(), models)


@pytest.mark.parametrize("budget", [math.inf, 0.9], ids=["every-round-due", "budgeted"])
def test_theory_rows_resume_bit_identically(budget, tmp_path, monkeypatch):
    """The tracker keeps no state of its own: its draws come from the seed and the round,
    and the budget from the federation's counted work and the rows so far."""
    theory = {"estimate": ["A", "sigma", "momentum"], "every": 1, "lanczos_steps": 5, "budget": budget, "clients": 2}
    config = config_of({"name": "mc", "lr": 0.05}, {"name": "large_gradient"}, theory=theory)
    rows, _ = uninterrupted(config, monkeypatch)
    measured = sorted({row["round"] for row in rows if row["metric"] == "theory_A2"})
    if math.isinf(budget):
        assert measured == list(range(10))
    else:  # the budget skips some due rounds, not all
        assert measured[0] == 0 and measured[-1] == 9 and 2 < len(measured) < 10, measured
    assert exact(resumed(config, tmp_path / "run.pt", stops=(5,))) == exact(rows)


def test_a_finished_checkpoint_returns_its_rows_without_stepping(tmp_path):
    config = config_of({"name": "local", "lr": 0.05}, {"name": "none"})
    path = tmp_path / "run.pt"
    rows = run_method(config.methods[0], config, 3, checkpoint=path).rows
    calls = []
    again = run_method(config.methods[0], config, 3, on_round=lambda: calls.append(1), checkpoint=path).rows
    assert calls == [] and exact(again) == exact(rows)


def test_checkpoint_holds_no_data_and_binds_the_rebuilt_task(tmp_path):
    """The training data (here 500 samples x 10 features per client) is far larger
    than the models; the checkpoint refers to it by name."""
    task = {**SYNTHETIC, "samples_per_client": 500, "validation_samples": 500, "test_samples": 500}
    config = config_of({"name": "fc", "lr": 0.01, "heavy_ball": 0.9}, {"name": "none"}, task)
    path = tmp_path / "run.pt"
    run_method(config.methods[0], config, 3, checkpoint=path)
    saved = load_run(config.methods[0], config, 3, path)
    inputs = saved.algorithm.federation.train.inputs
    assert inputs.shape[1] == 500  # bound to the rebuilt task's data
    assert path.stat().st_size < inputs.nbytes / 4


def test_fc_checkpoint_leaves_out_its_scratch(tmp_path):
    """FC's cross-gradient workspace and its [N, d] own-gradient and update buffers are
    rewritten every round: the checkpoint holds the models and the momentum buffer,
    and a restored FC has fresh scratch of the right shape."""
    task = {**SYNTHETIC, "dim": 4000}
    config = config_of({"name": "fc", "lr": 0.01, "heavy_ball": 0.9}, {"name": "none"}, task)
    path = tmp_path / "run.pt"
    run_method(config.methods[0], config, 3, checkpoint=path)
    saved = load_run(config.methods[0], config, 3, path)
    models = saved.algorithm.models
    assert path.stat().st_size < 2.5 * models.nbytes
    assert saved.algorithm._buffers == {}
    assert saved.algorithm._own.shape == saved.algorithm._updates.shape == models.shape


def test_checkpoint_name_is_a_safe_distinct_file_name():
    assert checkpoint_name("fc", 0) == "fc-seed0.pt"
    plus, space = checkpoint_name("global+median", 1), checkpoint_name("global median", 1)
    assert plus != space
    for name in (plus, space, checkpoint_name("../x/y", 2), checkpoint_name(".hidden", 3)):
        assert "/" not in name and not name.startswith(".") and name.endswith(".pt")


# -- a checkpoint belongs to one run --------------------------------------------------------
def test_fingerprint_mismatch_names_the_file(tmp_path):
    config = config_of({"name": "local", "lr": 0.05}, {"name": "none"})
    path = tmp_path / "run.pt"
    run_method(config.methods[0], config, 3, checkpoint=path)
    other_lr = config_of({"name": "local", "lr": 0.06}, {"name": "none"})
    for method, run_config, seed in ((other_lr.methods[0], other_lr, 3), (config.methods[0], config, 4)):
        with pytest.raises(CheckpointError, match=f"checkpoint {path} was written by another run"):
            run_method(method, run_config, seed, checkpoint=path)


def test_checkpoint_interval_is_not_part_of_the_fingerprint(tmp_path):
    """Resuming with another checkpoint_every continues the same trajectory."""
    config = config_of({"name": "fc", "lr": 0.05, "heavy_ball": 0.9}, {"name": "large_gradient"})
    reference = run_method(config.methods[0], config, 3).rows
    path = tmp_path / "run.pt"
    with pytest.raises(Stop):
        run_method(config.methods[0], config, 3, on_round=stop_after(5), checkpoint=path)
    every_three = config.model_copy(update={"checkpoint_every": 3})
    assert exact(run_method(every_three.methods[0], every_three, 3, checkpoint=path).rows) == exact(reference)


def test_other_format_version_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    save_checkpoint(path, 1, "abc", {"x": 1}, {})
    monkeypatch.setattr(checkpoints, "FORMAT_VERSION", checkpoints.FORMAT_VERSION + 1)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} has format"):
        load_checkpoint(path, "abc", lambda done: {})


def test_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=f"checkpoint {path} cannot be read"):
        load_checkpoint(path, "abc", lambda done: {})


def test_shared_objects_are_bound_by_name_with_the_saved_round(tmp_path):
    big, other = torch.arange(1000.0), torch.zeros(3)
    path = tmp_path / "c.pt"
    save_checkpoint(path, 7, "key", {"data": [big, big], "own": other}, {"data": big})
    rounds: list[int] = []
    replacement = torch.ones(1000)

    def shared(done: int) -> dict[str, Any]:
        rounds.append(done)
        return {"data": replacement}

    done, state = load_checkpoint(path, "key", shared)
    assert done == 7 and rounds == [7]
    assert state["data"][0] is replacement and state["data"][1] is replacement
    assert torch.equal(state["own"], other)
    with pytest.raises(CheckpointError, match="refers to 'data', which this run does not have"):
        load_checkpoint(path, "key", lambda done: {})


def test_views_keep_sharing_their_storage(tmp_path):
    whole = torch.zeros(5, 2)
    path = tmp_path / "c.pt"
    save_checkpoint(path, 0, "key", (whole, whole[1:]), {})
    _, (loaded, tail) = load_checkpoint(path, "key", lambda done: {})
    loaded[2, 0] = 1.0
    assert tail[1, 0] == 1.0


# -- atomicity ------------------------------------------------------------------------------
def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    save_checkpoint(path, 1, "key", {"generation": 1}, {})

    def dies_mid_write(obj: Any, handle: Any, **kwargs: Any) -> None:
        handle.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints.torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, 2, "key", {"generation": 2}, {})
    monkeypatch.undo()
    assert load_checkpoint(path, "key", lambda done: {}) == (1, {"generation": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def _save_forever(path: str) -> None:
    generation = 0
    while True:
        generation += 1
        payload = bytes([generation % 251]) * (4 << 20)
        save_checkpoint(Path(path), generation, "key", {"generation": generation, "payload": payload}, {})


def test_sigkill_during_saves_leaves_a_loadable_checkpoint(tmp_path):
    """A process rewriting a 4 MB checkpoint in a loop is SIGKILLed at seeded random
    moments: the file is always one whole generation, and the next save clears what
    the killed one left."""
    path = tmp_path / "c.pt"
    draw = random.Random(17)
    context = multiprocessing.get_context("fork")
    for _ in range(4):
        writer = context.Process(target=_save_forever, args=(str(path),))
        writer.start()
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(draw.uniform(0.0, 0.15))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        generation, state = load_checkpoint(path, "key", lambda done: {})
        assert state["generation"] == generation >= 1
        assert state["payload"] == bytes([generation % 251]) * (4 << 20)
    save_checkpoint(path, 0, "key", {}, {})
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


# -- the command line -------------------------------------------------------------------------
def write_config(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


SMALL_RUN = """\
    seeds = [0]
    rounds = 6
    eval_every = 2
    {every}
    [task]
    name = "synthetic_linear"
    clusters = 2
    clients_per_cluster = 3
    [[methods]]
    name = "fc"
    lr = {lr}
"""


def test_resume_without_checkpoint_every_exits_2_naming_it(tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", SMALL_RUN.format(every="", lr=0.05))
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--resume"]) == 2
    assert "checkpoint_every" in capsys.readouterr().err


def test_resume_of_a_changed_config_exits_2_naming_the_checkpoint(tmp_path, capsys):
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", SMALL_RUN.format(every="checkpoint_every = 2", lr=0.05))
    assert main(["run", str(config), "--out", str(out)]) == 0
    write_config(config, SMALL_RUN.format(every="checkpoint_every = 2", lr=0.07))
    assert main(["run", str(config), "--out", str(out), "--resume"]) == 2
    error = capsys.readouterr().err
    assert str(out / "checkpoints" / "fc-seed0.pt") in error and "another run" in error
    assert main(["run", str(config), "--out", str(out), "--overwrite"]) == 0  # not --resume: afresh


def test_run_without_resume_removes_old_checkpoints(tmp_path):
    out = tmp_path / "out"
    config = write_config(tmp_path / "c.toml", SMALL_RUN.format(every="checkpoint_every = 2", lr=0.05))
    stale = out / "checkpoints" / "fc-seed0.pt"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"left by an older run")
    with pytest.raises(CheckpointError, match="cannot be read"):
        run_experiment(load_config(config), out, resume=True)
    run_experiment(load_config(config), out)
    assert load_run(*method_and_seed(load_config(config)), stale).done == 6


def method_and_seed(config) -> tuple[Any, Any, int]:
    return config.methods[0], config, config.seeds[0]


def test_resume_needs_a_config_with_checkpoint_every():
    config = parse_config({"methods": [{"name": "local"}]})
    with pytest.raises(ConfigError, match="checkpoint_every"):
        run_experiment(config, Path("unused"), resume=True)


# -- acceptance: real SIGKILLs of `robust-pfl run`, then --resume ------------------------------
KILLED_RUN = """\
    seeds = [0]
    rounds = 36
    eval_every = 4
    batch_size = 32
    checkpoint_every = 2
    [task]
    name = "image"
    dataset = "digits"
    kind = "private_label"
    clusters = 2
    clients_per_cluster = 3
    model = {{ name = "mlp", hidden = [16] }}
    reshuffle_every_epoch = true
    [byzantine]
    total = 2
    [attack]
    name = "{attack}"
    [[methods]]
    name = "fc"
    lr = 0.1
    heavy_ball = 0.9
    [[methods]]
    name = "mc"
    lr = 0.1
    [[methods]]
    name = "global"
    label = "global+median"
    aggregator = "median"
    lr = 0.1
    heavy_ball = 0.9
"""


def checkpoint_marks(directory: Path) -> set[tuple[str, int]]:
    """(name, mtime) of each saved checkpoint; the hidden temporary files an atomic
    save writes and renames (they may vanish between listing and reading) are not
    checkpoints."""
    marks = set()
    for path in directory.glob("*.pt") if directory.exists() else []:
        if path.name.startswith("."):
            continue
        try:
            marks.add((path.name, path.stat().st_mtime_ns))
        except FileNotFoundError:  # replaced by the next save while listed
            continue
    return marks


def killed_and_resumed(config: Path, out: Path, kills: int, seed: int) -> int:
    """Run the CLI, SIGKILL it a seeded random moment after each of ``kills`` new
    checkpoints, resume with ``--resume`` until it exits 0; the kills that hit a
    running process."""
    draw = random.Random(seed)
    hits = 0
    for attempt in range(kills + 1):
        command = [sys.executable, "-m", "robust_pfl.cli", "--threads", "1", "run", str(config), "--out", str(out)]
        child = subprocess.Popen(command + (["--resume"] if attempt else []), cwd=ROOT)
        if attempt == kills:
            assert child.wait(timeout=300) == 0
            return hits
        before = checkpoint_marks(out / "checkpoints")
        deadline = time.monotonic() + 120
        while checkpoint_marks(out / "checkpoints") == before and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(draw.uniform(0.0, 0.3))
        hits += child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("attack", ["large_gradient", pytest.param("ball_edge", marks=pytest.mark.slow)])
def test_sigkilled_run_resumes_to_the_uninterrupted_result(attack, tmp_path):
    """`robust-pfl run` on digits (re-dealt every epoch of 4 rounds; FC with heavy ball,
    MC, Global with median) SIGKILLed three times at seeded random moments, then
    resumed: history.csv and every final model are bit-identical to a run never
    killed."""
    config = write_config(tmp_path / "run.toml", KILLED_RUN.format(attack=attack))
    reference = tmp_path / "reference"
    run_experiment(load_config(config), reference)
    out = tmp_path / "killed"
    assert killed_and_resumed(config, out, kills=3, seed=5) >= 2
    assert (out / "history.csv").read_bytes() == (reference / "history.csv").read_bytes()
    loaded = load_config(config)
    for method in loaded.methods:
        name = checkpoint_name(method.display, 0)
        final = load_run(method, loaded, 0, out / "checkpoints" / name)
        expected = load_run(method, loaded, 0, reference / "checkpoints" / name)
        assert final.done == expected.done == loaded.rounds
        assert torch.equal(final.algorithm.client_models(), expected.algorithm.client_models())


def test_restored_mc_finds_the_centre_slots_ahead_of_its_buffers(tmp_path):
    """MC keeps K free rows just ahead of its momenta, where pairwise clustering puts
    the starting centres so that their products come out of the points' Gram product
    (:func:`defenses.pairwise_clustering._stacked_ahead`); a restored MC, whose buffers
    moved, still finds them."""
    config = config_of({"name": "mc", "lr": 0.05, "method": "pairwise"}, {"name": "none"})
    path = tmp_path / "run.pt"
    run_method(config.methods[0], config, 3, checkpoint=path)
    algorithm = load_run(config.methods[0], config, 3, path).algorithm
    centres = torch.randn(algorithm.k, algorithm.momenta.shape[1], dtype=algorithm.momenta.dtype)
    placed = algorithm._centres_in_slot(algorithm.momenta, centres)
    assert placed.untyped_storage().data_ptr() == algorithm.momenta.untyped_storage().data_ptr()
    assert placed.data_ptr() + placed.nbytes == algorithm.momenta.data_ptr()


@pytest.mark.parametrize("written_after", [False, True])
def test_heavy_ball_carried_bound_survives_only_while_valid(written_after, tmp_path):
    """HeavyBall carries an upper bound on max|params| from its last in-place step while
    nothing else wrote to them (their version counter).  Loading gives tensors new
    counters: a bound valid at saving is carried on, one made stale by a later write is
    dropped (and ``max|params|`` recomputed, as without a checkpoint)."""
    params = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    optimizer = defenses.HeavyBall(0.5, 0.0, params)
    optimizer.apply_gathered(params, torch.tensor([[4.0, 4.0]]), torch.tensor([0, 0]))
    carried = optimizer._largest(params)
    assert carried > params.abs().max()  # a bound, not the maximum
    if written_after:
        params.mul_(0.5)
    path = tmp_path / "c.pt"
    save_checkpoint(path, 1, "key", (params, optimizer), {})
    _, (loaded_params, loaded) = load_checkpoint(path, "key", lambda done: {})
    expected = float(loaded_params.abs().max()) if written_after else carried
    assert loaded._largest(loaded_params) == expected
    assert loaded._moved is None and loaded._spare is None  # scratch is not saved


def test_a_checkpoint_naming_a_class_by_its_former_module_loads(tmp_path, monkeypatch):
    """``HeavyBall`` moved from ``defenses.base`` to ``defenses.optimiser``: a
    checkpoint pickled while it lived in ``defenses.base`` must load as the same class
    (``checkpoint.MOVED_CLASSES``), with its state."""
    import defenses.base
    from defenses.optimiser import HeavyBall

    optimiser = HeavyBall(0.5, 0.9, torch.zeros(3, 2))
    optimiser.apply(torch.ones(3, 2), torch.full((3, 2), 2.0))
    monkeypatch.setattr(HeavyBall, "__module__", "defenses.base")
    monkeypatch.setattr(defenses.base, "HeavyBall", HeavyBall, raising=False)
    path = tmp_path / "old.pt"
    save_checkpoint(path, 3, "key", {"optimiser": optimiser}, {})
    assert b"defenses.base" in path.read_bytes()
    monkeypatch.undo()
    assert not hasattr(defenses.base, "HeavyBall")

    done, state = load_checkpoint(path, "key", lambda done: {})
    assert done == 3 and type(state["optimiser"]) is HeavyBall
    assert torch.equal(state["optimiser"].buffer, torch.full((3, 2), 2.0))


OLD = ROOT / "tests" / "data" / "old_checkpoints"


def old_fixture(name: str, tmp_path: Path) -> tuple[Any, Path]:
    """The validated config of the old checkpoint ``name`` and a copy of its file."""
    import json
    import shutil

    config = validate(parse_config(json.loads((OLD / "configs.json").read_text())[name]))
    path = tmp_path / f"{name}.pt"
    shutil.copy(OLD / f"{name}.pt", path)
    return config, path


def test_an_old_mc_checkpoint_is_refused_since_its_defaults_changed(tmp_path):
    """MC's re-seed default changed (merged -> challenger) and its cell balls and
    hysteresis did not exist when the old checkpoint was written: resuming it would
    mix two algorithms, so it is refused, naming the old values (the fields added
    since read as the values the old run used: Alg. 3's balls, the nearest centre)."""
    config, path = old_fixture("mc", tmp_path)
    with pytest.raises(CheckpointError, match="reseed='merged'.*centre_update='ball'.*switch_margin=0.0"):
        run_method(config.methods[0], config, 3, checkpoint=path)


#: The old checkpoints were written by ``make.py`` on an AMD EPYC; stopped after 5 of 9
#: rounds, each holds the state after its last checkpoint round.
OLD_ROUND = 4
#: Relative difference allowed between the rows of a resumed old checkpoint and a run
#: from scratch made here.  The checkpoint holds float32 state computed on the CPU that
#: wrote it; the 5 rounds resumed from it run here, and another CPU model (an Intel Xeon
#: against the AMD EPYC that wrote them) may sum in another order (vector widths, MKL's
#: code path) and differ in the last bit of an op (float32's epsilon is 1.2e-7).  Seen:
#: ``train_loss`` 0x1.1c0f1fa8p+16 against 0x1.1c0f1da8p+16, 1.1e-7 apart.  1e-5 leaves
#: about 100 such steps for 5 rounds to grow, and still sees a changed weight or round
#: (:func:`test_the_old_checkpoint_comparison_sees_a_changed_weight_or_round`).
FOREIGN_RELATIVE = 1e-5
#: The same, absolute, for values near 0 (a relative difference of a tiny loss is noise).
FOREIGN_ABSOLUTE = 1e-6


def row_mismatches(resumed: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[str]:
    """How ``resumed`` differs from ``fresh`` beyond :data:`FOREIGN_RELATIVE` (and
    :data:`FOREIGN_ABSOLUTE`): rows keyed by (method, seed, round, metric) that one has
    and the other lacks or repeats, and values further apart (NaN equals NaN); empty
    when they agree."""

    def keyed(rows: list[dict[str, Any]]) -> list[tuple[tuple[Any, ...], float]]:
        return [((row["method"], row["seed"], row["round"], row["metric"]), float(row["value"])) for row in rows]

    ours, theirs = keyed(resumed), keyed(fresh)
    if [key for key, _ in ours] != [key for key, _ in theirs]:
        return [f"rows differ: resumed {[key for key, _ in ours]}, fresh {[key for key, _ in theirs]}"]
    return [
        f"{key}: resumed {a!r}, fresh {b!r}"
        for (key, a), (_, b) in zip(ours, theirs)
        if not (math.isnan(a) and math.isnan(b))
        and not math.isclose(a, b, rel_tol=FOREIGN_RELATIVE, abs_tol=FOREIGN_ABSOLUTE)
    ]


def stored_records(path: Path) -> list[bytes]:
    """The bytes of every tensor storage ``torch.save`` wrote into ``path`` (a zip
    archive: one ``<archive>/data/<key>`` record per storage), read without torch."""
    with zipfile.ZipFile(path) as archive:
        return [archive.read(name) for name in archive.namelist()
                if "/data/" in name and not name.endswith(".pkl")]


def stored_floats(path: Path) -> set[str]:
    """The exact (hex) form of every Python float pickled in ``path``'s object graph,
    read from its ``data.pkl`` with :mod:`pickletools` (no class is imported)."""
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(name for name in archive.namelist() if name.endswith("/data.pkl")))
    return {float(arg).hex() for op, arg, _ in pickletools.genops(data) if op.name in ("BINFLOAT", "FLOAT")}


def resaved(name: str, path: Path, tmp_path: Path, change=None, done: int | None = None) -> Path:
    """The old checkpoint ``path`` loaded and written again as this version writes it:
    with ``change(algorithm)`` applied and ``done`` as its round, when given."""
    config = old_fixture(name, tmp_path)[0]
    method, seed = config.methods[0], config.seeds[0]
    saved = load_run(method, config, seed, path)
    if change is not None:
        change(saved.algorithm)
    state = {"algorithm": saved.algorithm, "rows": saved.table.rows, "random": saved.random_state}
    target = tmp_path / f"{name}-resaved.pt"
    shared = RunParts.build(config, seed).shared(saved.algorithm.federation)
    save_checkpoint(target, saved.done if done is None else done, fingerprint(config, method, seed), state, shared)
    return target


@pytest.mark.filterwarnings("ignore:config. methods.0..aggregator.f")  # global-bulyan's f = 1, as it was written
@pytest.mark.parametrize("name", sorted(path.stem for path in OLD.glob("*.pt")))
def test_an_old_checkpoint_loads_exactly_as_stored(name, tmp_path):
    """Loading does no arithmetic, so it is exact on any CPU (for every old checkpoint,
    those refused on resuming too): the round is the one ``make.py`` stopped after, every stored row value is one the file holds, and every
    tensor storage in the file is, byte for byte, one of the loaded state's (written
    again: this version adds fields since, so the file it writes may hold more)."""
    config, path = old_fixture(name, tmp_path)
    saved = load_run(config.methods[0], config, config.seeds[0], path)
    assert saved.done == OLD_ROUND
    assert {row["round"] for row in saved.table.rows} == {0, 2, OLD_ROUND}
    floats = stored_floats(path)
    assert all(float(row["value"]).hex() in floats for row in saved.table.rows)
    loaded = [hashlib.sha256(record).hexdigest() for record in stored_records(resaved(name, path, tmp_path))]
    missing = [index for index, record in enumerate(stored_records(path))
               if hashlib.sha256(record).hexdigest() not in loaded]
    assert missing == [], f"stored storages {missing} are not among the loaded state's"


@pytest.mark.parametrize("name", ["fc", "ifca"])
def test_a_checkpoint_written_before_the_engine_and_aggregators_moved_resumes(name, tmp_path):
    """Checkpoints written at commit d6839b2 (``tests/data/old_checkpoints/make.py``),
    whose pickles name ``robust_pfl.federation``, ``robust_pfl.checkpoint``,
    ``defenses.aggregators``, ``defenses.aggregators`` and
    ``defenses.aggregators``, load through ``MOVED_MODULES`` and resume to the
    rows of a run that never stopped, within :data:`FOREIGN_RELATIVE`: they were
    written on another CPU, so bits are compared only by the tests that run both
    halves here (``test_stopped_and_resumed_run_is_bit_identical``)."""
    config, path = old_fixture(name, tmp_path)
    assert b"robust_pfl.federation" in path.read_bytes() or b"robust_pfl.checkpoint" in path.read_bytes()
    resumed = run_method(config.methods[0], config, 3, checkpoint=path).rows
    assert row_mismatches(resumed, run_method(config.methods[0], config, 3).rows) == []


def nudged_weight(algorithm: Any) -> None:
    """FC's model of its first honest client (``models`` is ``[N, d]``) with 1 added to
    its first weight (5.2 in the fixture; the models' weights are of order 10-100 and
    the losses of order 1e5 in this attacked run, so the rows move by about 1.6e-4
    relative: a change of 1e-2 or less moves them by less than :data:`FOREIGN_RELATIVE`
    and cannot be told from another CPU's rounding by the rows alone)."""
    honest = int(torch.nonzero(algorithm.federation.honest)[0])
    algorithm.models[honest, 0] += 1.0


@pytest.mark.parametrize("change", ["weight", "round"])
def test_the_old_checkpoint_comparison_sees_a_changed_weight_or_round(change, tmp_path):
    """The tolerance of :func:`row_mismatches` is not so loose that a real change
    passes: the old FC checkpoint with 1 added to one model weight (:func:`nudged_weight`), or with its round
    counter set back from 4 to 2, resumes to rows it reports as different."""
    config, path = old_fixture("fc", tmp_path)
    fresh = run_method(config.methods[0], config, 3).rows
    unchanged = resaved("fc", path, tmp_path)
    assert row_mismatches(run_method(config.methods[0], config, 3, checkpoint=unchanged).rows, fresh) == []
    if change == "weight":
        changed = resaved("fc", path, tmp_path, change=nudged_weight)
    else:
        changed = resaved("fc", path, tmp_path, done=2)
    assert row_mismatches(run_method(config.methods[0], config, 3, checkpoint=changed).rows, fresh) != []


def test_a_checkpoint_whose_budget_was_the_old_default_is_refused(tmp_path):
    """``global-krum-nnm`` left NNM's budget unset, which meant f = 1 when it was written;
    it now follows the run's 2 Byzantine clients.  Resuming would mix the two runs, so
    the checkpoint is refused, naming both parameter sets."""
    config, path = old_fixture("global-krum-nnm", tmp_path)
    with pytest.raises(CheckpointError, match="NearestNeighbourMixing\\(f=None.*NearestNeighbourMixing\\(f=2"):
        run_method(config.methods[0], config, 3, checkpoint=path)


def test_a_checkpoint_whose_attack_defaults_changed_is_refused(tmp_path):
    """``global-bulyan`` runs ``optimised`` with its defaults, which were a 9-scale grid
    when it was written and are now a grid with 0, a line search and a refinement: the
    checkpoint is refused, naming both attacks."""
    config, path = old_fixture("global-bulyan", tmp_path)
    with pytest.raises(CheckpointError, match="written with the attack Optimised.*scales=\\(0.01,.*builds Optimised"):
        run_method(config.methods[0], config, 3, checkpoint=path)
