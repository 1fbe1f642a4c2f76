"""Seconds per round, peak memory and achieved FLOP/s of Federated-Clustering (FC,
Werner et al. Alg. 2) and Momentum-Clustering (MC, Alg. 4), against a plain
per-client-loop reference and against this machine's own matmul throughput.

Run from the repository root::

    python benchmarks/bench_rounds.py            # N = 64 and the Fig. 6 scale (~12 min)
    python benchmarks/bench_rounds.py --quick    # N = 64 only (< 2 min)

It prints a table and writes ``benchmarks/results.json``.  Every configuration runs in
its own subprocess, so its peak resident memory (``VmHWM``) is that configuration's
alone; the matmul roofline and the loop reference are measured inside that same
process, and every figure reported is a ratio of two measurements taken there.  By
default each configuration runs twice: with glibc's default allocator, and with its
thresholds fixed so that fresh large tensors never fault in pages (``nofault``: the
loop reference's clustering makes several such tensors per round).  See
``benchmarks/README.md`` for the method (FLOP counting, sampling, extrapolation).

Workload: the MLP 784-200-10 (``DenseNetwork(784, 10, (200,), "cross_entropy")``,
d = 159,010), batch 32, synthetic MNIST-shaped data (``inputs[N, 64, 784]`` uniform in
[0, 1), labels 0-9), K = 4 hidden clusters, the large-gradient attack of Fig. 6
(``randn * 200 + 1e6``) on the Byzantine rows, FC with one group.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

import attacks  # noqa: E402
import defenses  # noqa: E402
from robust_pfl.engine.data import Batch, ClientData  # noqa: E402
from robust_pfl.engine.federation import Federation  # noqa: E402
from robust_pfl.engine.objectives import DenseNetwork  # noqa: E402

# -- the workload -----------------------------------------------------------------------

SCALES: dict[str, dict[str, int]] = {
    # 4 clusters x 13 honest + 12 Byzantine = 64 clients (about Fig. 6's 20% Byzantine).
    "n64": {"clusters": 4, "honest_per_cluster": 13, "byzantine": 12},
    # Fig. 6: 4 clusters x 50 honest + 50 Byzantine (the official code's total) = 250.
    "fig6": {"clusters": 4, "honest_per_cluster": 50, "byzantine": 50},
}
SAMPLES_PER_CLIENT = 64
BATCH_SIZE = 32
LR = 0.1
QUANTILE = 0.2
CLUSTERING_ROUNDS = 10
RADIUS = {"policy": "quantile", "q": QUANTILE}
ATTACK_MEAN, ATTACK_STD = 1e6, 200.0
# FC receivers timed per round (then extrapolated; 0 = all, full rounds): all at
# N = 64 (a round takes about 1.5 s), 12 of 200 at the Fig. 6 scale (a whole number of
# chunks at 256/1024/4096 MB).
DEFAULT_RECEIVERS = {"n64": 0, "fig6": 12}
TARGETS = {"fc_roofline_fraction": 0.5, "fc_peak_gib": 8.0, "fc_speedup": 10.0, "mc_speedup": 20.0}


def make_network() -> DenseNetwork:
    return DenseNetwork(784, 10, (200,), "cross_entropy")


class SampledFederation(Federation):
    """A :class:`Federation` whose ``honest`` mask can be cut to its first
    ``receiver_limit`` honest clients.

    FC computes cross gradients for, and clusters at, the honest receivers only, so a
    limit makes ``step`` process a sample of receivers with the full set of senders
    (all data, models and chunk shapes at full scale).  The cost of a round is linear
    in the number of receivers; the benchmark counts the receiver rows that actually
    reach ``cross_gradients`` and extrapolates from that count, so if FC ever stops
    reading ``honest`` the extrapolation factor simply becomes 1.  The attack reads
    ``byzantine``, which is never cut.
    """

    receiver_limit: int | None = None

    @property
    def honest(self) -> Tensor:
        mask = ~self.byzantine
        if self.receiver_limit is None:
            return mask
        keep = mask.nonzero().squeeze(-1)[: self.receiver_limit]
        cut = torch.zeros_like(mask)
        cut[keep] = True
        return cut


def build_federation(scale: str, seed: int = 0, device: str | torch.device = "cpu") -> SampledFederation:
    """The workload at ``scale`` on ``device``.  The data are drawn on the device by a
    generator there: at 10,000 clients the inputs are 2 GB, slow to draw on the host
    and copy over.  Another device therefore draws other (equally distributed) data
    than the CPU from the same seed."""
    spec = SCALES[scale]
    k, per, byz = spec["clusters"], spec["honest_per_cluster"], spec["byzantine"]
    honest = k * per
    n = honest + byz
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    inputs = torch.rand(n, SAMPLES_PER_CLIENT, 784, generator=g, device=device)
    targets = torch.randint(0, 10, (n, SAMPLES_PER_CLIENT), generator=g, device=device)
    cluster_ids = torch.cat([torch.arange(honest) % k, torch.arange(byz) % k])
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[honest:] = True
    return SampledFederation(
        objective=make_network(),
        train=ClientData(inputs, targets),
        cluster_ids=cluster_ids,
        byzantine=byzantine,
        seed=seed,
        batch_size=BATCH_SIZE,
        attack=attacks.build("large_gradient", {"mean": ATTACK_MEAN, "std": ATTACK_STD}),
        device=device,
    )


def gradient_flops(net: DenseNetwork, batch_rows: int) -> int:
    """Matmul FLOPs of one client's gradient at one model on ``batch_rows`` samples:
    per sample and layer, forward ``2 in out``, weight gradient ``2 in out``, and for
    every layer but the first the back-propagated signal ``2 in out`` (bias adds,
    activations and the softmax are not counted)."""
    per_sample = 0
    for index, layer in enumerate(net.layers):
        per_sample += 4 * layer.in_features * layer.out_features
        if index > 0:
            per_sample += 2 * layer.in_features * layer.out_features
    return per_sample * batch_rows


# -- measurement helpers ----------------------------------------------------------------


class Roofline:
    """This machine's float32 matmul throughput, sampled by timing one square GEMM."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self.a = torch.randn(size, size)
        self.b = torch.randn(size, size)
        self.c = torch.empty(size, size)
        torch.mm(self.a, self.b, out=self.c)  # library initialisation
        self.samples: list[float] = []

    def probe(self, times: int = 1) -> float:
        """Run the GEMM ``times`` times; returns the seconds spent."""
        spent = 0.0
        for _ in range(times):
            start = time.perf_counter()
            torch.mm(self.a, self.b, out=self.c)
            seconds = time.perf_counter() - start
            spent += seconds
            self.samples.append(2 * self.size**3 / seconds)
        return spent

    def since(self, first: int) -> float:
        """Median GEMM rate (FLOP/s) of the samples taken from index ``first`` on."""
        return statistics.median(self.samples[first:])


class GradientMeter:
    """Times every call of ``fed.cross_gradients`` and ``fed.gradients`` (the gradient
    work) and counts the (model, client) pairs it evaluated."""

    def __init__(self, fed: Federation, flops_per_pair: int) -> None:
        self.flops_per_pair = flops_per_pair
        self.reset()
        cross, paired = fed.cross_gradients, fed.gradients

        def timed_cross(params: Tensor, batch: Batch, out: Tensor | None = None) -> Tensor:
            start = time.perf_counter()
            result = cross(params, batch, out=out)
            seconds = time.perf_counter() - start
            self.seconds += seconds
            self.starts.append(start)
            self.call_seconds.append(seconds)
            self.pairs += params.shape[0] * batch.clients
            self.receivers += params.shape[0]
            self.chunk_rows.append(params.shape[0])
            return result

        def timed_paired(params: Tensor, batch: Batch, out: Tensor | None = None, **options: Any) -> Tensor:
            start = time.perf_counter()
            result = paired(params, batch, out=out, **options)
            self.seconds += time.perf_counter() - start
            return result

        objective_paired = fed.objective.paired_gradients

        def counted_paired(params: Tensor, batch: Batch, out: Tensor | None = None, **options: Any) -> Tensor:
            self.pairs += params.shape[0]  # rows actually computed (unread Byzantine rows are skipped)
            return objective_paired(params, batch, out=out, **options)

        fed.cross_gradients = timed_cross  # type: ignore[method-assign]
        fed.gradients = timed_paired  # type: ignore[method-assign]
        object.__setattr__(fed.objective, "paired_gradients", counted_paired)

    def time_step(self, optimizer: Any) -> None:
        """Record when ``optimizer.apply`` (the round's closing step) starts."""
        apply = optimizer.apply

        def timed_apply(*args: Any, **kwargs: Any) -> Any:
            self.step_start = time.perf_counter()
            return apply(*args, **kwargs)

        optimizer.apply = timed_apply

    def reset(self) -> None:
        self.step_start: float | None = None
        self.seconds = 0.0
        self.pairs = 0
        self.receivers = 0
        self.chunk_rows: list[int] = []
        self.starts: list[float] = []
        self.call_seconds: list[float] = []

    @property
    def flops(self) -> int:
        return self.pairs * self.flops_per_pair


def peak_rss_gib() -> float:
    """Peak resident set size of this process (VmHWM, else ru_maxrss), GiB."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def current_rss_gib() -> float:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# -- the plain per-client-loop reference ------------------------------------------------


class LoopReference:
    """A straightforward implementation, the "official-code-like" baseline: an
    ``nn.Sequential`` MLP, ``torch.autograd`` one client batch at a time, Python loops
    over clients (and for FC over receiver x sender pairs), Threshold-Clustering
    written with plain tensor operations on the stacked ``[N, d]`` messages."""

    def __init__(self, fed: Federation, seed: int = 1) -> None:
        net = fed.objective
        assert isinstance(net, DenseNetwork) and net.loss_kind == "cross_entropy"
        modules: list[nn.Module] = []
        for index, layer in enumerate(net.layers):
            modules.append(nn.Linear(layer.in_features, layer.out_features, bias=layer.bias))
            if index < len(net.layers) - 1:
                modules.append(nn.ReLU())
        self.model = nn.Sequential(*modules)
        self.fed = fed
        self.dim = net.dim
        self.generator = torch.Generator().manual_seed(seed)

    def load(self, params: Tensor) -> None:
        """Copy one flat parameter vector into the ``nn`` model."""
        with torch.no_grad():
            nn.utils.vector_to_parameters(params, self.model.parameters())

    def gradient(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """``g_j(x)``: autograd on one client's batch at the loaded parameters."""
        self.model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(inputs.reshape(inputs.shape[0], -1)), targets)
        loss.backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

    def attack_row(self) -> Tensor:
        return torch.randn(self.dim, generator=self.generator) * ATTACK_STD + ATTACK_MEAN

    @staticmethod
    def threshold_clustering(points: Tensor, centre: Tensor, rounds: int) -> Tensor:
        """Alg. 3 with one centre: ``v += (1/N) sum_{||z_j - v|| <= tau} (z_j - v)``."""
        n = points.shape[0]
        admissible = torch.isfinite(points).all(dim=1)
        for _ in range(rounds):
            distances = torch.linalg.vector_norm(points - centre, dim=1)
            distances[~admissible] = math.inf
            tau = torch.quantile(distances, QUANTILE)
            inside = distances <= tau
            centre = centre + (points[inside] - centre).sum(0) / n
        return centre

    # FC ----------------------------------------------------------------------------
    def fc_receivers(self, models: Tensor, batch: Batch, receivers: list[int]) -> Tensor:
        """FC's work for the given receivers: ``g_j(x_i)`` for every sender ``j`` (a
        Byzantine sender sends the attack's row instead), Threshold-Clustering started
        at ``g_i(x_i)``, and the SGD step.  Returns the receivers' new models."""
        byzantine = self.fed.byzantine.tolist()
        new_models = []
        for i in receivers:
            self.load(models[i])
            rows = []
            for j in range(len(byzantine)):
                if byzantine[j]:
                    rows.append(self.attack_row())
                else:
                    rows.append(self.gradient(batch.inputs[j], batch.targets[j]))
            received = torch.stack(rows)
            centre = self.threshold_clustering(received, received[i].clone(), CLUSTERING_ROUNDS)
            new_models.append(models[i] - LR * centre)
        return torch.stack(new_models)

    # MC ----------------------------------------------------------------------------
    def mc_state(self, models: Tensor, clusters: int) -> dict[str, Any]:
        return {"models": models.clone(), "momenta": torch.zeros_like(models), "centres": None, "k": clusters}

    def mc_round(self, state: dict[str, Any], batch: Batch, alpha: float = 0.1) -> None:
        """One MC round: momenta by a client loop, K-centre Threshold-Clustering
        warm-started from last round (first round: K random honest messages),
        nearest-centre assignment by a client loop, SGD step by a client loop."""
        models, momenta = state["models"], state["momenta"]
        byzantine = self.fed.byzantine.tolist()
        messages = []
        for i, is_byzantine in enumerate(byzantine):
            if is_byzantine:
                messages.append(self.attack_row())
            else:
                self.load(models[i])
                g = self.gradient(batch.inputs[i], batch.targets[i])
                momenta[i] = alpha * g + (1 - alpha) * momenta[i]
                messages.append(momenta[i])
        received = torch.stack(messages)
        n = received.shape[0]
        if state["centres"] is None:
            honest = [i for i, b in enumerate(byzantine) if not b]
            pick = torch.randperm(len(honest), generator=self.generator)[: state["k"]]
            state["centres"] = [received[honest[p]].clone() for p in pick.tolist()]
        centres = state["centres"]
        admissible = torch.isfinite(received).all(dim=1)
        for _ in range(CLUSTERING_ROUNDS):
            for k, centre in enumerate(centres):
                distances = torch.linalg.vector_norm(received - centre, dim=1)
                distances[~admissible] = math.inf
                tau = torch.quantile(distances, QUANTILE)
                inside = distances <= tau
                centres[k] = centre + (received[inside] - centre).sum(0) / n
        for i, is_byzantine in enumerate(byzantine):
            if not is_byzantine:
                nearest = min(range(len(centres)), key=lambda k: float(torch.dist(received[i], centres[k])))
                models[i] -= LR * centres[nearest]


# -- workers (one configuration per subprocess) ----------------------------------------


def _section(roof: Roofline, probes: int = 3) -> int:
    first = len(roof.samples)
    roof.probe(probes)
    return first


def gradient_sweep(
    fed: Federation, models: Tensor, receivers: Tensor, rows: int, roof: Roofline, flops_per_pair: int,
    probe_every_s: float = 2.0,
) -> dict[str, float]:
    """Time ``Federation.cross_gradients`` over all receiver chunks of ``rows`` models
    (one reused output buffer, as FC does), with GEMM probes interleaved so that the
    roofline is sampled under the same load."""
    batch = fed.sample_batch()
    n = fed.clients
    buffer = torch.empty(rows, n, models.shape[1], dtype=models.dtype)
    fed.cross_gradients(models[receivers[:rows]], batch, out=buffer)  # first touch of the buffer
    first = _section(roof)
    seconds, pairs, since_probe = 0.0, 0, 0.0
    for start in range(0, receivers.numel(), rows):
        chunk = receivers[start : start + rows]
        t = time.perf_counter()
        fed.cross_gradients(models[chunk], batch, out=buffer[: chunk.numel()])
        dt = time.perf_counter() - t
        seconds += dt
        since_probe += dt
        pairs += chunk.numel() * n
        if since_probe >= probe_every_s:
            roof.probe()
            since_probe = 0.0
    roof.probe(2)
    achieved = pairs * flops_per_pair / seconds
    gemm = roof.since(first)
    return {
        "sweep_seconds": seconds,
        "sweep_pairs": pairs,
        "sweep_gflops": achieved / 1e9,
        "sweep_gemm_gflops": gemm / 1e9,
        "sweep_roofline_fraction": achieved / gemm,
    }


def single_thread_kernel(
    fed: Federation, models: Tensor, receivers: Tensor, rows: int, flops_per_pair: int, reps: int = 3
) -> dict[str, float]:
    """The same chunk kernel and GEMM on one thread, interleaved (less sensitive to a
    neighbour occupying one of the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        roof = Roofline()
        batch = fed.sample_batch()
        buffer = torch.empty(rows, fed.clients, models.shape[1], dtype=models.dtype)
        chunk = receivers[:rows]
        fed.cross_gradients(models[chunk], batch, out=buffer[: chunk.numel()])
        rates, gemms = [], []
        for _ in range(reps):
            roof.probe()
            gemms.append(roof.samples[-1])
            t = time.perf_counter()
            fed.cross_gradients(models[chunk], batch, out=buffer[: chunk.numel()])
            rates.append(chunk.numel() * fed.clients * flops_per_pair / (time.perf_counter() - t))
        ratios = [r / g for r, g in zip(rates, gemms)]
        return {
            "one_thread_gflops": statistics.median(rates) / 1e9,
            "one_thread_gemm_gflops": statistics.median(gemms) / 1e9,
            "one_thread_roofline_fraction": statistics.median(ratios),
        }
    finally:
        torch.set_num_threads(threads)


def _extrapolate_fc(meter: GradientMeter, start: float, end: float, total: int) -> dict[str, float]:
    """A full round from a sampled one.  A chunk's span runs from its
    ``cross_gradients`` call to the next one (the last span to the optimiser step,
    which is added once).  The first chunk pays one-off costs (first touch of the
    reused workspace), so when two or more chunks were timed the remaining receivers
    are charged at the per-receiver cost of the later chunks; otherwise linearly."""
    rows, starts, grad = meter.chunk_rows, meter.starts, meter.call_seconds
    # the optimiser step (the whole [N, d] tensor, once per round) is charged once
    step_start = meter.step_start if meter.step_start is not None else end
    spans = [b - a for a, b in zip(starts, starts[1:])] + [step_start - starts[-1]]
    before = starts[0] - start
    if len(rows) >= 2:
        per_receiver = sum(spans[1:]) / sum(rows[1:])
        grad_per_receiver = sum(grad[1:]) / sum(rows[1:])
        rate = sum(rows[1:]) * meter.flops_per_pair * (meter.pairs // meter.receivers) / sum(grad[1:])
    else:
        per_receiver = spans[0] / rows[0]
        grad_per_receiver = grad[0] / rows[0]
        rate = meter.flops / meter.seconds
    rest = total - rows[0]
    return {
        "seconds_per_round": before + spans[0] + rest * per_receiver + (end - step_start),
        "gradient_seconds_per_round": grad[0] + rest * grad_per_receiver,
        "gradient_gflops": rate / 1e9,
        "first_chunk_seconds": spans[0],
        "first_chunk_gradient_seconds": grad[0],
    }


def worker_fc(spec: dict[str, Any]) -> dict[str, Any]:
    fed = build_federation(spec["scale"], spec.get("seed", 0))
    flops_per_pair = gradient_flops(fed.objective, BATCH_SIZE)
    honest_total = int((~fed.byzantine).sum())
    # FC's chunk: memory_budget_mb // (2 d bytes x senders) receivers (FederatedClustering
    # .step); the sample is a whole number of full chunks, at least ``receivers``.
    chunk = min(honest_total, max(1, (spec["budget_mb"] << 20) // (2 * fed.objective.dim * 4 * fed.clients)))
    receivers = spec.get("receivers")
    if receivers is None:
        receivers = DEFAULT_RECEIVERS[spec["scale"]]
    receivers = receivers or honest_total
    fed.receiver_limit = min(honest_total, math.ceil(max(receivers, chunk) / chunk) * chunk)
    rss_data = current_rss_gib()
    roof = Roofline()
    algorithm = defenses.build(
        "fc",
        fed,
        {
            "lr": LR,
            "radius": RADIUS,
            "clustering_rounds": CLUSTERING_ROUNDS,
            "method": spec["method"],
            "memory_budget_mb": spec["budget_mb"],
        },
    )
    algorithm.snapshot_records = False  # as the experiment runner does
    meter = GradientMeter(fed, flops_per_pair)
    meter.time_step(algorithm.optimizer)
    first = _section(roof)
    start = time.perf_counter()
    algorithm.step(0)
    end = time.perf_counter()
    # A sampled round ends as a full one does: the optimiser steps the whole [N, d]
    # tensor (FederatedClustering.step), so its peak memory is the full round's.
    peak = peak_rss_gib()
    roof.probe(2)
    round_gemm = roof.since(first)
    estimate = _extrapolate_fc(meter, start, end, honest_total)
    result: dict[str, Any] = {
        "method_used": resolved_method(algorithm, fed),
        "receivers_timed": meter.receivers,
        "receivers_total": honest_total,
        "extrapolated": meter.receivers < honest_total,
        "models_per_chunk": max(meter.chunk_rows),
        "chunks_timed": len(meter.chunk_rows),
        "chunks_per_round": math.ceil(honest_total / max(meter.chunk_rows)),
        "sample_seconds": end - start,
        **estimate,
        "gradient_share": estimate["gradient_seconds_per_round"] / estimate["seconds_per_round"],
        "round_gemm_gflops": round_gemm / 1e9,
        "round_roofline_fraction": estimate["gradient_gflops"] * 1e9 / round_gemm,
        "peak_rss_gib": peak,
        "rss_after_data_gib": rss_data,
    }
    rows = max(meter.chunk_rows)
    limit = fed.receiver_limit
    models = algorithm.client_models().clone()
    fed.receiver_limit = None
    all_receivers = (~fed.byzantine).nonzero().squeeze(-1)
    if spec.get("sweep"):
        result.update(gradient_sweep(fed, models, all_receivers, rows, roof, flops_per_pair))
        result.update(single_thread_kernel(fed, models, all_receivers, rows, flops_per_pair))
    # the loop reference, in this process, interleaved with further library rounds
    loop = LoopReference(fed)
    batch = fed.sample_batch()
    sample = all_receivers[: spec["loop_receivers"]].tolist()
    loop.load(models[sample[0]])
    loop.gradient(batch.inputs[0], batch.targets[0])  # warm-up (autograd)

    def library_round(round_index: int) -> float:
        fed.receiver_limit = limit
        meter.reset()
        start = time.perf_counter()
        algorithm.step(round_index)
        return _extrapolate_fc(meter, start, time.perf_counter(), honest_total)["seconds_per_round"]

    def loop_round() -> float:
        start = time.perf_counter()
        loop.fc_receivers(models, batch, sample)
        return (time.perf_counter() - start) * honest_total / len(sample)

    result.update(
        {
            "first_round_seconds": result["seconds_per_round"],
            "loop_receivers_timed": len(sample),
            **_paired(library_round, loop_round, spec.get("pairs", 3), first_round=1),
            "gemm_gflops_median": statistics.median(roof.samples) / 1e9,
        }
    )
    return result


def _paired(
    library_round: Callable[[int], float], loop_round: Callable[[], float], pairs: int, first_round: int
) -> dict[str, Any]:
    """Library rounds and loop-reference rounds taken alternately, so that both meet
    the same load (another tenant's work drifts over seconds to minutes).  The speedup
    is the median of the per-pair ratios; the seconds are medians too."""
    library, reference = [], []
    for index in range(pairs):
        library.append(library_round(first_round + index))
        reference.append(loop_round())
    return {
        "seconds_per_round": statistics.median(library),
        "round_times": library,
        "loop_seconds_per_round": statistics.median(reference),
        "loop_round_times": reference,
        "loop_rounds_timed": pairs,
        "speedup_vs_loop": statistics.median(b / a for a, b in zip(library, reference)),
    }


def worker_mc(spec: dict[str, Any]) -> dict[str, Any]:
    fed = build_federation(spec["scale"], spec.get("seed", 0))
    flops_per_pair = gradient_flops(fed.objective, BATCH_SIZE)
    roof = Roofline()
    algorithm = defenses.build(
        "mc",
        fed,
        {"lr": LR, "radius": RADIUS, "clustering_rounds": CLUSTERING_ROUNDS, "method": spec["method"]},
    )
    algorithm.snapshot_records = False  # as the experiment runner does
    meter = GradientMeter(fed, flops_per_pair)
    algorithm.step(0)  # k-means++ seeding happens here; later rounds are warm-started
    loop = LoopReference(fed)
    state = loop.mc_state(fed.init_params(1).expand(fed.clients, -1), fed.clusters)
    loop.mc_round(state, fed.sample_batch())  # round 0: centres seeded
    first = _section(roof)
    grads, flops = [], []

    def library_round(round_index: int) -> float:
        meter.reset()
        start = time.perf_counter()
        algorithm.step(round_index)
        seconds = time.perf_counter() - start
        grads.append(meter.seconds)
        flops.append(meter.flops)
        return seconds

    def loop_round() -> float:
        batch = fed.sample_batch()
        start = time.perf_counter()
        loop.mc_round(state, batch)
        return time.perf_counter() - start

    paired = _paired(library_round, loop_round, spec["rounds"], first_round=1)
    peak = peak_rss_gib()
    roof.probe(2)
    gemm = roof.since(first)
    grad_rate = sum(flops) / sum(grads)
    return {
        "method_used": resolved_method(algorithm, fed),
        "rounds_timed": spec["rounds"],
        **paired,
        "gradient_seconds_per_round": statistics.median(grads),
        "gradient_share": sum(grads) / sum(paired["round_times"]),
        "gradient_gflops": grad_rate / 1e9,
        "round_gemm_gflops": gemm / 1e9,
        "round_roofline_fraction": grad_rate / gemm,
        "peak_rss_gib": peak,
        "gemm_gflops_median": statistics.median(roof.samples) / 1e9,
    }


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"fc": worker_fc, "mc": worker_mc}


def run_worker(spec: dict[str, Any]) -> None:
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    load_before = load_average()
    start = time.perf_counter()
    result = WORKERS[spec["algorithm"]](spec)
    result.update(
        {"wall_seconds": time.perf_counter() - start, "load_before": load_before, "load_after": load_average()}
    )
    print("RESULT " + json.dumps(result), flush=True)


# -- orchestration ------------------------------------------------------------------------


def plan(quick: bool, receivers: int, budgets: list[int], methods: list[str]) -> list[dict[str, Any]]:
    scales = ["n64", "fig6"]
    specs = []
    for scale in scales:
        fc_budgets = [1024] if quick else budgets
        for budget in fc_budgets:
            for index, method in enumerate(methods):
                specs.append(
                    {
                        "algorithm": "fc",
                        "scale": scale,
                        "method": method,
                        "budget_mb": budget,
                        "receivers": receivers,
                        # the gradient sweep depends on the chunk size only: once per budget
                        "sweep": index == 0,
                        "loop_receivers": 8 if scale == "n64" else 2,
                        # paired rounds; N = 64 rounds are cheap, so more pairs steady the median
                        "pairs": 9 if scale == "n64" else 5,
                    }
                )
        for method in methods:
            specs.append(
                {
                    "algorithm": "mc",
                    "scale": scale,
                    "method": method,
                    # paired rounds (the first rounds after seeding cost more: time
                    # several); at N = 64 a pair takes about 1 s, so more steady the median
                    "rounds": 15 if scale == "n64" else 7,
                }
            )
    return specs


# glibc settings that stop ``malloc`` from returning large blocks to the kernel: with
# them, a fresh large tensor reuses memory already mapped instead of faulting in new
# pages.  By default glibc's threshold for that adapts to the allocation history, so
# code that makes fresh multi-MB temporaries every step (the loop reference's
# clustering) runs up to 3x faster in some processes than in others.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "2147483647", "MALLOC_TRIM_THRESHOLD_": "4294967295"}


# What a row keeps of its fault-free (``--malloc fixed``) twin.
FAULT_FREE_KEYS = (
    "seconds_per_round", "round_times", "loop_seconds_per_round", "loop_round_times",
    "speedup_vs_loop", "peak_rss_gib", "load_before", "load_after", "wall_seconds",
)


def launch(spec: dict[str, Any], malloc: str = "default") -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    env = {**os.environ, **(FIXED_MALLOC if malloc == "fixed" else {})}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker failed ({proc.returncode}) for {spec}:\n{proc.stdout}\n{proc.stderr}")


def verdicts(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, bool]:
    out = {}
    if spec["algorithm"] == "fc":
        out["speedup>=10x"] = result["speedup_vs_loop"] >= TARGETS["fc_speedup"]
        if spec["scale"] == "fig6":
            out["peak<=8GiB"] = result["peak_rss_gib"] <= TARGETS["fc_peak_gib"]
            if "sweep_roofline_fraction" in result:
                out["roofline>=50%"] = result["sweep_roofline_fraction"] >= TARGETS["fc_roofline_fraction"]
    else:
        out["speedup>=20x"] = result["speedup_vs_loop"] >= TARGETS["mc_speedup"]
    return out


def method_label(spec: dict[str, Any], result: dict[str, Any]) -> str:
    """The configured evaluation, with what ``auto`` resolved to."""
    used = result.get("method_used", spec["method"])
    return spec["method"] if used == spec["method"] else f"{spec['method']}:{used}"


def resolved_method(algorithm: Any, fed: Federation) -> str:
    """The evaluation ``algorithm`` uses on this federation's messages (one group)."""
    return algorithm.params.distance_method(torch.empty(fed.clients, fed.objective.dim, device="meta"))


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'scale':5} {'alg':3} {'method':14} {'budget':>6} {'M':>3} {'s/round':>8} {'grad s':>7} "
        f"{'grad%':>5} {'GF/s':>6} {'gemm':>6} {'roof%':>5} {'sweep%':>6} {'1thr%':>5} "
        f"{'peakGiB':>7} {'loop s':>8} {'speedup':>7} {'nofault':>7}  targets"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        spec, res = row["spec"], row["result"]
        sweep = res.get("sweep_roofline_fraction")
        one = res.get("one_thread_roofline_fraction")
        flags = " ".join(f"{k}:{'yes' if v else 'NO'}" for k, v in row["verdicts"].items())
        extra = "*" if res.get("extrapolated") else " "
        fault_free = row.get("fault_free")
        nofault = "" if fault_free is None else f"{fault_free['speedup_vs_loop']:.1f}x"
        lines.append(
            f"{spec['scale']:5} {spec['algorithm']:3} {method_label(spec, res):14} "
            f"{spec.get('budget_mb', '-'):>6} {res.get('models_per_chunk', '-'):>3} "
            f"{res['seconds_per_round']:>7.2f}{extra} {res['gradient_seconds_per_round']:>7.2f} "
            f"{100 * res['gradient_share']:>5.1f} {res['gradient_gflops']:>6.1f} "
            f"{res['round_gemm_gflops']:>6.1f} {100 * res['round_roofline_fraction']:>5.1f} "
            f"{'' if sweep is None else f'{100 * sweep:.1f}':>6} {'' if one is None else f'{100 * one:.1f}':>5} "
            f"{res['peak_rss_gib']:>7.2f} {res['loop_seconds_per_round']:>8.1f} "
            f"{res['speedup_vs_loop']:>6.1f}x {nofault:>7}  {flags}"
        )
    return "\n".join(lines)


LEGEND = """\
s/round: library seconds per round (* = FC timed on a sample of receivers with all
  senders, extrapolated to all honest receivers at the cost per receiver of the chunks
  after the first); M: receivers (models) per cross-gradient chunk; grad s: time inside Federation.cross_gradients /
  gradients per round; grad%: its share of the round; GF/s: achieved matmul FLOP/s of
  the gradient work; gemm: float32 2048^3 GEMM GFLOP/s sampled in the same process
  around the round; roof%: GF/s / gemm during the round; sweep%: the same for
  cross_gradients over all receiver chunks of a Fig.-6/N=64 round (GEMM probes
  interleaved); 1thr%: one chunk vs GEMM, both on one thread; peakGiB: VmHWM of the
  configuration's own process; loop s: plain per-client-loop reference per round
  (FC: timed on a few receivers, extrapolated); speedup: loop s / s/round; nofault:
  the same speedup in a second process with glibc's thresholds fixed, where fresh
  large tensors never fault in pages (the loop's clustering makes several per round;
  targets are read from the default-allocator speedup)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 64 only, FC at 1024 MB (< 2 minutes)")
    parser.add_argument(
        "--receivers", type=int, default=None,
        help="FC receivers timed per round, extrapolated to all honest ones "
        "(default: all at N = 64, 12 at the Fig. 6 scale; 0: full rounds)",
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024], help="FC memory_budget_mb values (1024 is the library default)")
    parser.add_argument(
        "--methods", nargs="+", default=["auto", "direct"], choices=["auto", "pairwise", "gram", "direct"],
        help="Threshold-Clustering evaluations (auto, the library default, resolves to "
        "pairwise at N = 64 and gram at the Fig. 6 scale)",
    )
    parser.add_argument("--algorithms", nargs="+", default=["fc", "mc"], choices=["fc", "mc"])
    parser.add_argument("--scales", nargs="+", default=None, choices=["n64", "fig6"],
                        help="default: n64 with --quick, else both")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the workers (0: torch's default)")
    parser.add_argument(
        "--malloc", choices=["both", "default", "fixed"], default="both",
        help="fixed: run the workers with glibc's MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ "
        "set high, so that fresh large tensors never fault in new pages (see FIXED_MALLOC); "
        "both (default): every configuration with the default allocator, then again fixed",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(json.loads(args.worker))
        return 0
    scales = args.scales or (["n64"] if args.quick else ["n64", "fig6"])
    specs = [
        spec for spec in plan(args.quick, args.receivers, args.budgets, args.methods)
        if spec["algorithm"] in args.algorithms and spec["scale"] in scales
    ]
    rows = []
    started = time.perf_counter()
    load_start = load_average()
    for spec in specs:
        spec["threads"] = args.threads
        label = f"{spec['scale']} {spec['algorithm']} {spec['method']} {spec.get('budget_mb', '')}".strip()
        print(f"running {label} ...", flush=True)
        result = launch(spec, "default" if args.malloc == "both" else args.malloc)
        row = {"spec": spec, "result": result, "verdicts": verdicts(spec, result)}
        print(f"  {result['seconds_per_round']:.2f} s/round, speedup {result['speedup_vs_loop']:.1f}x, "
              f"peak {result['peak_rss_gib']:.2f} GiB ({result['wall_seconds']:.0f} s)", flush=True)
        if args.malloc == "both":  # the same pairs without page faults (no sweeps: they do not change)
            fixed = launch({**spec, "sweep": False}, "fixed")
            row["fault_free"] = {key: fixed[key] for key in FAULT_FREE_KEYS if key in fixed}
            print(f"  without page faults: {fixed['seconds_per_round']:.2f} s/round, loop "
                  f"{fixed['loop_seconds_per_round']:.2f} s, speedup {fixed['speedup_vs_loop']:.1f}x", flush=True)
        rows.append(row)
    table = format_table(rows)
    print()
    print(table)
    print()
    print(LEGEND)
    fc = [r for r in rows if r["spec"]["algorithm"] == "fc"]
    for scale in sorted({r["spec"]["scale"] for r in fc}):
        for budget in sorted({r["spec"]["budget_mb"] for r in fc}):
            pair = {r["spec"]["method"]: r["result"]["seconds_per_round"] for r in fc
                    if r["spec"]["scale"] == scale and r["spec"]["budget_mb"] == budget}
            if len(pair) >= 2:
                fastest = min(pair, key=pair.get)
                others = ", ".join(f"{pair[m] / pair[fastest]:.2f}x {m}" for m in sorted(pair, key=pair.get)[1:])
                print(f"FC {scale} budget {budget} MB: {fastest} fastest; seconds per round against it: {others}")
    report = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quick": args.quick,
        "total_seconds": time.perf_counter() - started,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": args.threads or torch.get_num_threads(),
            "malloc": args.malloc,
            "load_average_start": load_start,
            "load_average_end": load_average(),
        },
        "workload": {
            "network": "DenseNetwork(784, 10, (200,), 'cross_entropy')",
            "dim": make_network().dim,
            "batch_size": BATCH_SIZE,
            "samples_per_client": SAMPLES_PER_CLIENT,
            "scales": SCALES,
            "gradient_flops_per_pair": gradient_flops(make_network(), BATCH_SIZE),
            "attack": {"name": "large_gradient", "mean": ATTACK_MEAN, "std": ATTACK_STD},
            "radius": RADIUS,
            "clustering_rounds": CLUSTERING_ROUNDS,
            "fc_receivers_sampled": args.receivers if args.receivers is not None else DEFAULT_RECEIVERS,
        },
        "targets": TARGETS,
        "rows": rows,
        "table": table,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out} ({report['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
