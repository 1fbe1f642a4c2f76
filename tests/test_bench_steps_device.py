"""benchmarks/bench_steps.py on a chosen device (issue 27): the --device option, the
scale rows (run here on the CPU at a tiny size), the time limit and the JSON written
after every configuration.  Everything runs on the CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_rounds  # noqa: E402  (benchmarks/ is not a package)
import bench_steps  # noqa: E402


# -- the option --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:3"])
def test_device_option_accepts_the_cpu_and_cuda_devices(name: str) -> None:
    _, args = bench_steps.parse_args(["--device", name])
    assert args.device == name


def test_device_option_defaults_to_the_cpu() -> None:
    _, args = bench_steps.parse_args([])
    assert args.device == "cpu"
    assert args.time_limit is None


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "cuda0", "CPU"])
def test_device_option_rejects_other_names(name: str) -> None:
    with pytest.raises(SystemExit) as raised:
        bench_steps.parse_args(["--device", name])
    assert raised.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_card_is_a_usage_error_before_anything_runs(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "steps.json"
    with pytest.raises(SystemExit) as raised:
        bench_steps.main(["--device", "cuda", "--out", str(out)])
    assert raised.value.code == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not out.exists()


# -- the scale rows ------------------------------------------------------------------------------


def test_scale_rows_are_the_issues_four_configurations() -> None:
    """Global (mean), IFCA and MC with 10,000 clients; FC with 16 groups at 1,000."""
    rows = {c.label: c for c in bench_steps.large_configs(sorted(bench_steps.defenses.REGISTRY))}
    assert set(rows) == {"global mean", "ifca", "mc", "fc g=16"}
    assert {label: c.clients for label, c in rows.items()} == {
        "global mean": 10_000, "ifca": 10_000, "mc": 10_000, "fc g=16": 1_000}
    assert rows["global mean"].options["aggregator"]["name"] == "mean"
    assert rows["fc g=16"].options["groups"] == 16
    assert all(c.scale == "large" for c in rows.values())


@pytest.mark.parametrize("clients", [40, 250, 1_000, 10_000])
def test_scale_rows_have_a_fifth_byzantine_and_four_equal_clusters(clients: int) -> None:
    spec = bench_steps.large_spec(clients)
    assert spec["clusters"] * spec["honest_per_cluster"] + spec["byzantine"] == clients
    assert spec["byzantine"] == clients // 5
    assert spec["clusters"] == 4


def test_scale_rows_at_the_fig6_size_are_the_fig6_workload() -> None:
    assert bench_steps.large_spec(250) == bench_rounds.SCALES["fig6"]


def test_cuda_targets_cover_the_scale_rows_only_at_the_issues_sizes() -> None:
    targets = bench_steps.CUDA_TARGETS
    for config in bench_steps.large_configs(["global", "ifca", "mc", "fc"]):
        assert bench_steps.target_key(config.label, config.scale, config.clients) in targets
    for config in bench_steps.large_configs(["global", "ifca", "mc", "fc"], clients=40):
        assert bench_steps.target_key(config.label, config.scale, config.clients) not in targets
    # the CPU keeps its own targets, without the GPU's scale rows
    assert not any(key.endswith(("n10000_s", "n1000_s")) for key in bench_steps.TARGETS)


@pytest.mark.slow
def test_scale_rows_run_on_the_cpu_at_a_tiny_size() -> None:
    """Each of the four scale rows at 40 clients (8 Byzantine), one timed step: the
    row's time and floor are finite and positive, the floor is the sum of its parts
    and the ratio their quotient, and the floor counts the 32 honest clients' gradients
    and the 8 attack rows."""
    device = torch.device("cpu")
    rates = bench_steps.make_rates(bench_rounds.make_network().dim, device)
    rates.roof = bench_rounds.Roofline(512)  # a smaller GEMM probe keeps the test short
    configs = bench_steps.large_configs(["global", "ifca", "mc", "fc"], clients=40)
    assert len(configs) == 4
    for config in configs:
        row = bench_steps.run_config(config, rates, quick=True, device=device, steps=1)
        assert (row["label"], row["scale"], row["clients"], row["device"]) == (config.label, "large", 40, "cpu")
        assert len(row["step_times"]) == 1
        for key in ("seconds", "floor_s", "gemm_s", "memory_s", "rng_s", "peak_rss_gib"):
            assert math.isfinite(row[key]) and row[key] > 0, (config.label, key, row[key])
        assert row["floor_s"] == pytest.approx(row["gemm_s"] + row["memory_s"] + row["rng_s"])
        assert row["ratio"] == pytest.approx(row["seconds"] / row["floor_s"])
        assert all(math.isfinite(v) and v > 0 for v in row["rates"].values())
        assert "peak_device_gib" not in row  # no card, no card memory
        if config.method == "fc":  # H^2 / G pairs, H B / G attack rows
            assert row["work"]["pairs"] == pytest.approx(32 * 32 / 16)
            assert row["work"]["draws"] == pytest.approx(32 * 8 / 16)
        else:
            assert row["work"]["pairs"] == 32
            assert row["work"]["draws"] == 8


def test_the_card_probe_gives_each_rate_once_per_sample(monkeypatch: Any) -> None:
    """CudaRates' probes, at small sizes on the CPU (no synchronisation needed): every
    sample adds one finite positive GEMM, copy and sampling rate, and ``since`` is the
    median of the samples from the given index on."""
    monkeypatch.setattr(bench_steps.CudaRates, "GEMM", 128)
    monkeypatch.setattr(bench_steps.CudaRates, "COPY_VALUES", 1 << 16)
    monkeypatch.setattr(bench_steps.CudaRates, "NORMAL_ROWS", 4)
    rates = bench_steps.CudaRates(1000, torch.device("cpu"))
    assert rates.sample() == 0
    assert rates.sample() == 1
    assert {key: len(values) for key, values in rates.samples.items()} == {"gemm": 2, "bandwidth": 2, "normals": 2}
    assert all(math.isfinite(v) and v > 0 for values in rates.samples.values() for v in values)
    assert rates.since(1) == {key: values[1] for key, values in rates.samples.items()}


# -- the time limit and the JSON -----------------------------------------------------------------


class FakeRun:
    """Stands in for the worker processes: every configuration takes ``cost`` seconds
    on a fake clock, and the JSON on disk is read at each launch."""

    def __init__(self, out: Path, cost: float) -> None:
        self.out = out
        self.cost = cost
        self.now = 0.0
        self.launched: list[tuple[str, float | None]] = []
        self.json_seen: list[dict[str, Any]] = []

    def clock(self) -> float:
        return self.now

    def launch(self, spec: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        config = spec["config"]
        self.launched.append((config["label"], timeout))
        if self.out.exists():
            self.json_seen.append(json.loads(self.out.read_text()))
        self.now += self.cost
        if timeout is not None and self.cost > timeout:
            raise subprocess.TimeoutExpired("worker", timeout)
        return {
            **config, "clients": 64, "device": spec["device"], "seconds": 1.0, "floor_s": 0.5, "ratio": 2.0,
            "rates": {"gemm": 1e11, "bandwidth": 1e10, "normals": 1e8}, "load_before": 0.0,
        }


def fake_main(monkeypatch: Any, tmp_path: Path, cost: float, limit: float) -> tuple[FakeRun, int, dict[str, Any]]:
    out = tmp_path / "steps.json"
    fake = FakeRun(out, cost)
    monkeypatch.setattr(bench_steps, "launch", fake.launch)
    monkeypatch.setattr(bench_steps, "deadline_clock", fake.clock)
    code = bench_steps.main([
        "--methods", "ifca", "local", "mc", "--scales", "n64", "--no-aggregators", "--no-setup",
        "--time-limit", str(limit), "--out", str(out),
    ])
    return fake, code, json.loads(out.read_text())


def test_time_limit_skips_the_configurations_left_and_lists_them(monkeypatch: Any, tmp_path: Path) -> None:
    """Configurations of 10 s under a 20 s limit: the first two start (at 0 s and 10 s,
    each given the time left as its timeout) and finish; the third would start at 20 s
    and is skipped."""
    fake, code, report = fake_main(monkeypatch, tmp_path, cost=10.0, limit=20.0)
    assert code == 0
    assert [label for label, _ in fake.launched] == ["ifca", "local"]
    assert [timeout for _, timeout in fake.launched] == [pytest.approx(20.0), pytest.approx(10.0)]
    assert [row["label"] for row in report["rows"]] == ["ifca", "local"]
    assert [(s["name"], s["reason"]) for s in report["skipped"]] == [("mc @ n64", "time limit")]
    assert "skipped: mc @ n64" in report["tables"]
    assert report["complete"] is True
    assert report["time_limit_s"] == 20.0


def test_a_configuration_running_at_the_limit_is_stopped_and_listed(monkeypatch: Any, tmp_path: Path) -> None:
    """Configurations of 10 s under a 5 s limit: the first is stopped at the limit, the
    others never start; nothing is reported as measured."""
    fake, code, report = fake_main(monkeypatch, tmp_path, cost=10.0, limit=5.0)
    assert code == 0
    assert [label for label, _ in fake.launched] == ["ifca"]
    assert report["rows"] == []
    assert [(s["name"], s["reason"]) for s in report["skipped"]] == [
        ("ifca @ n64", "stopped at the time limit"), ("local @ n64", "time limit"), ("mc @ n64", "time limit")]
    assert report["machine"]["gemm_gflops_median"] is None


def test_the_json_holds_every_finished_configuration_while_the_run_goes_on(monkeypatch: Any, tmp_path: Path) -> None:
    """The file read when the k-th configuration starts is valid JSON, not yet marked
    complete, with the k - 1 rows before it: a kill then keeps what was measured."""
    fake, _, report = fake_main(monkeypatch, tmp_path, cost=1.0, limit=100.0)
    assert [label for label, _ in fake.launched] == ["ifca", "local", "mc"]
    assert [[row["label"] for row in seen["rows"]] for seen in fake.json_seen] == [["ifca"], ["ifca", "local"]]
    assert all(seen["complete"] is False for seen in fake.json_seen)
    assert report["complete"] is True and len(report["rows"]) == 3 and report["skipped"] == []


def test_a_real_run_writes_valid_json_with_the_device(tmp_path: Path) -> None:
    """One scale row in its own process, end to end."""
    out = tmp_path / "steps.json"
    code = bench_steps.main([
        "--scales", "large", "--scale-clients", "40", "--methods", "global", "--steps", "1",
        "--no-aggregators", "--no-setup", "--time-limit", "600", "--out", str(out),
    ])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["machine"]["device"] == "cpu"
    assert report["complete"] is True and report["skipped"] == [] and report["failed"] == []
    [row] = report["rows"]
    assert (row["label"], row["clients"]) == ("global mean", 40)
    assert math.isfinite(row["seconds"]) and row["seconds"] > 0
    assert math.isfinite(row["floor_s"]) and row["floor_s"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["steps.json"]  # no temporary file left behind
