"""Momentum-Clustering's regime suite: are MC's rules chosen on some tasks good on
others?  (``robust-pfl reproduce mc-regimes``; docs/mc.md.)

Thirteen regimes of the embedded digits vary what decides whether MC's momenta can be
clustered: data per client (15 to about 110 training images), clusters (2 to 8),
clients per cluster, how clusters differ (private labels, rotations, label skew,
Dirichlet label mixes), run length (30 to 600 rounds) and the Byzantine fraction (0 to
1/3).  They are split in two:

* **selection** regimes, where MC's rules are chosen: every candidate of
  :data:`CANDIDATES` runs there, and the one with the highest mean final
  **validation** accuracy wins (never test accuracy);
* **evaluation** regimes, untouched while choosing, where the winner is reported
  beside FC, Local and Alg. 4 as printed, by final **test** accuracy.

Every method runs SGD with lr 0.1 and batch 16; FC and Local add heavy-ball momentum
0.9 (as on the systems table, ``configs/pfl_systems_digits.toml``); MC's candidates use
their own momentum only.  ARI is the adjusted Rand index of the honest clients'
final assignment against the true clusters; FC assigns no clusters, so its ARI is that
of k-means (K centres, 10 restarts) on its honest clients' final models.  ``reseeds``
counts the rounds in which MC's centres were re-seeded.

Each run's result is written as JSON under ``OUT/runs/`` before the next starts, so a
killed suite resumes where it stopped.  ``OUT/mc_regimes.md`` is the page; with
``page`` (the CLI's ``--page``) the block between ``<!-- mc-regimes:begin -->`` and
``<!-- mc-regimes:end -->`` of that file is replaced by it.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from defenses.clustering_algorithms import ALG4_AS_PRINTED
from robust_pfl.config import parse_config
from robust_pfl.engine.metrics import adjusted_rand_index
from robust_pfl.experiments import build_task, run_method
from robust_pfl.provenance import git_commit, machine_text
from robust_pfl.recipes import QUICK_SENTENCE

Role = Literal["selection", "evaluation"]


@dataclass(frozen=True)
class Regime:
    """One task of the suite: the image task's fields, the run length and the
    Byzantine clients (``byzantine`` of them, sending ``attack``)."""

    name: str
    role: Role
    task: dict[str, Any]
    rounds: int
    byzantine: int = 0
    attack: str = "none"

    def config(self, methods: list[dict[str, Any]], seed: int, rounds: int) -> dict[str, Any]:
        """The run config of ``methods`` on this regime (``rounds`` rounds)."""
        task = {"name": "image", "dataset": "digits", "model": {"name": "mlp", "hidden": [200]}, **self.task}
        config: dict[str, Any] = {"seeds": [seed], "rounds": rounds, "eval_every": rounds, "batch_size": 16,
                                  "task": task, "methods": methods}
        if self.byzantine:
            config["byzantine"] = {"total": self.byzantine}
            config["attack"] = {"name": self.attack}
        return config


def _private(clusters: int, per_cluster: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "private_label", "clusters": clusters, "clients_per_cluster": per_cluster, **extra}


REGIMES: tuple[Regime, ...] = (
    Regime("systems task (4 x 5 + 4 idle Byzantine, 53 images)", "selection", _private(4, 5), 150, 4),
    Regime("29 images per client (4 x 5)", "selection", _private(4, 5, train_per_client=29), 150),
    Regime("300 rounds (4 x 5, 64 images)", "selection", _private(4, 5), 300),
    Regime("rotation (4 x 6, 54 images)", "selection", {"kind": "rotation", "clusters": 4, "clients_per_cluster": 6},
           100),
    Regime("2 clusters, large gradient (2 x 8 + 4, 65 images)", "selection", _private(2, 8), 100, 4,
           "large_gradient"),
    Regime("10 per cluster (4 x 10, 29 images)", "evaluation", _private(4, 10), 150),
    Regime("15 images per client (4 x 5)", "evaluation", _private(4, 5, train_per_client=15), 150),
    Regime("label skew, 108 images (2 x 6)", "evaluation",
           {"kind": "label_skew", "clusters": 2, "clients_per_cluster": 6}, 100),
    Regime("8 clusters (8 x 4, 40 images)", "evaluation", _private(8, 4), 150),
    Regime("600 rounds (4 x 5, 64 images)", "evaluation", _private(4, 5), 600),
    Regime("30 rounds, rotation (4 x 5, 64 images)", "evaluation",
           {"kind": "rotation", "clusters": 4, "clients_per_cluster": 5}, 30),
    Regime("Byzantine 1/3, bit flip (3 x 6 + 9, 48 images)", "evaluation", _private(3, 6), 150, 9, "bit_flip"),
    Regime("Dirichlet labels (3 x 6, 72 images)", "evaluation",
           {"kind": "dirichlet", "clusters": 3, "clients_per_cluster": 6}, 150),
)

#: MC's defaults before the rules of this suite (alpha 0.01, dense seeds, re-seeding
#: merged centres).
MERGE_RULE: dict[str, Any] = {"alpha": 0.01, "seed_from": "dense", "reseed": "merged", "centre_update": "ball",
                              "switch_margin": 0.0}

#: MC option sets compared on the selection regimes; ``{}`` is the package default.
CANDIDATES: dict[str, dict[str, Any]] = {
    "default": {},
    "Alg. 4 as printed": ALG4_AS_PRINTED,
    "merge rule (previous default)": MERGE_RULE,
    "no hysteresis": {"switch_margin": 0.0},
    "hysteresis 0.15": {"switch_margin": 0.15},
    "hysteresis 0.5": {"switch_margin": 0.5},
    "no challenger": {"reseed": "merged", "merge_tolerance": 0.01},
    "Alg. 3 balls": {"centre_update": "ball"},
    "alpha 0.03": {"alpha": 0.03},
    "radius q 0.35": {"radius": {"policy": "quantile", "q": 0.35}},
    "bias correction": {"bias_correction": True},
    "first alpha 1": {"first_alpha": 1.0},
}

BASELINES: dict[str, dict[str, Any]] = {
    "FC": {"name": "fc", "lr": 0.1, "heavy_ball": 0.9, "radius": {"policy": "quantile", "q": 0.2}},
    "Local": {"name": "local", "lr": 0.1, "heavy_ball": 0.9},
}


#: The clustering bar: a final ARI of at least this (the evaluation's bar wherever FC's
#: models reach it; in selection, the eligibility of a candidate).
ARI_BAR = 0.8


@dataclass(frozen=True)
class Mode:
    seeds: int
    round_scale: float
    regimes_per_role: int | None  # None: all


FULL = Mode(seeds=2, round_scale=1.0, regimes_per_role=None)
QUICK = Mode(seeds=1, round_scale=0.1, regimes_per_role=2)


def mc_method(label: str, options: dict[str, Any]) -> dict[str, Any]:
    """MC's method entry with ``options`` over the package defaults (lr 0.1)."""
    return {"label": label, "name": "mc", "lr": 0.1, **options}


@dataclass
class Outcome:
    """One run's final metrics."""

    validation_accuracy: float
    test_accuracy: float
    ari: float | None
    reseeds: float | None
    seconds: float


@dataclass
class Suite:
    """Runs the suite into ``out`` (one JSON file per run), resuming what is there."""

    out: Path
    mode: Mode
    runs: int = 0
    run_seconds: float = 0.0  # of every run read or made, as each measured itself

    def regimes(self, role: Role) -> list[Regime]:
        chosen = [regime for regime in REGIMES if regime.role == role]
        return chosen[: self.mode.regimes_per_role] if self.mode.regimes_per_role else chosen

    def rounds(self, regime: Regime) -> int:
        return max(5, round(regime.rounds * self.mode.round_scale))

    def outcome(self, regime: Regime, label: str, method: dict[str, Any], seed: int) -> Outcome:
        """The run of ``method`` on ``regime`` for ``seed``, from its file or run now."""
        slug = "".join(ch if ch.isalnum() else "_" for ch in f"{regime.name}__{label}__{seed}")
        path = self.out / "runs" / f"{slug}.json"
        if path.exists():
            return self._counted(Outcome(**json.loads(path.read_text())))
        config = parse_config(regime.config([{"label": label, **method}], seed, self.rounds(regime)))
        start = time.perf_counter()
        models: dict[str, Any] = {}
        table = run_method(config.methods[0], config, seed, finished=lambda algorithm: models.update(
            models=algorithm.client_models()))
        final = {row["metric"]: row["value"] for row in table.rows if row["round"] == config.rounds}
        ari = final.get("ari")
        if ari is None:
            ari = model_ari(build_task(config, seed), models["models"])
        result = Outcome(final["validation_accuracy"], final["test_accuracy"], ari, final.get("reseeds"),
                         time.perf_counter() - start)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(result.__dict__))
        temporary.replace(path)
        return self._counted(result)

    def _counted(self, outcome: Outcome) -> Outcome:
        self.runs += 1
        self.run_seconds += outcome.seconds
        return outcome

    def outcomes(self, regime: Regime, label: str, method: dict[str, Any]) -> list[Outcome]:
        return [self.outcome(regime, label, method, seed) for seed in range(self.mode.seeds)]


def model_ari(task: Any, models: torch.Tensor) -> float:
    """ARI of k-means (the task's K, 10 restarts, seeded) on the honest clients' models
    against their true clusters: whether a method without an assignment (FC) ends
    with models grouped by cluster."""
    from defenses.kmeans_init import kmeans

    honest = ~task.byzantine
    generator = torch.Generator().manual_seed(0)
    clusters = int(task.cluster_ids.max()) + 1
    labels = kmeans(models[honest].detach().cpu().double(), clusters, generator).labels
    return adjusted_rand_index(task.cluster_ids[honest], labels)


def _mean(values: list[float | None]) -> float | None:
    kept = [value for value in values if value is not None]
    return statistics.fmean(kept) if kept else None


def select(suite: Suite) -> tuple[str, dict[str, dict[str, float | None]]]:
    """Every candidate on every selection regime; the winner by mean validation
    accuracy (over regimes and seeds) among the candidates that keep the clusters
    there (mean final ARI at least :data:`ARI_BAR` on every selection regime, the bar
    the evaluation applies; the first candidate listed on ties).  Returns the winner
    and, per candidate, the per-regime validation means, ``"mean"``, and
    ``"worst ARI"``."""
    scores: dict[str, dict[str, float | None]] = {}
    for label, options in CANDIDATES.items():
        per_regime: dict[str, float | None] = {}
        aris: list[float] = []
        for regime in suite.regimes("selection"):
            runs = suite.outcomes(regime, f"MC [{label}]", mc_method(f"MC [{label}]", options))
            per_regime[regime.name] = _mean([run.validation_accuracy for run in runs])
            aris.append(_mean([run.ari for run in runs]) or 0.0)
        per_regime["mean"] = _mean(list(per_regime.values()))
        per_regime["worst ARI"] = min(aris)
        scores[label] = per_regime
    eligible = [label for label in scores if (scores[label]["worst ARI"] or 0.0) >= ARI_BAR] or list(scores)
    winner = max(eligible, key=lambda label: scores[label]["mean"] or 0.0)
    return winner, scores


def evaluate(suite: Suite, winner: str) -> list[dict[str, Any]]:
    """The winner, Alg. 4 as printed, FC and Local on every evaluation regime."""
    methods = {
        f"MC [{winner}]": mc_method(f"MC [{winner}]", CANDIDATES[winner]),
        "MC [Alg. 4 as printed]": mc_method("MC [Alg. 4 as printed]", ALG4_AS_PRINTED),
        **BASELINES,
    }
    rows = []
    for regime in suite.regimes("evaluation"):
        row: dict[str, Any] = {"regime": regime.name, "rounds": suite.rounds(regime)}
        for label, method in methods.items():
            runs = suite.outcomes(regime, label, method)
            row[label] = {
                "test": _mean([run.test_accuracy for run in runs]),
                "tests": [run.test_accuracy for run in runs],
                "ari": _mean([run.ari for run in runs]),
                "reseeds": [run.reseeds for run in runs],
            }
        rows.append(row)
    return rows


def verdicts(rows: list[dict[str, Any]], winner: str) -> list[str]:
    """The issue's bars per evaluation regime: MC at least Local, within 5 points of
    FC, and an ARI of at least 0.8 wherever FC's is."""
    mc = f"MC [{winner}]"
    lines = []
    for row in rows:
        ours, fc, local = row[mc], row["FC"], row["Local"]
        misses = []
        if ours["test"] < local["test"]:
            misses.append("below Local")
        if ours["test"] < fc["test"] - 0.05:
            misses.append(f"{100 * (fc['test'] - ours['test']):.1f} points below FC")
        if fc["ari"] is not None and fc["ari"] >= ARI_BAR and (ours["ari"] or 0.0) < ARI_BAR:
            misses.append(f"ARI {ours['ari']:.2f} where FC's models give {fc['ari']:.2f}")
        lines.append(f"- {row['regime']}: " + ("meets every bar" if not misses else "; ".join(misses)))
    return lines


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _ari(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _reseeds(values: list[float | None]) -> str:
    kept = [f"{int(value)}" for value in values if value is not None]
    return ", ".join(kept)


def page(winner: str, scores: dict[str, dict[str, float | None]], rows: list[dict[str, Any]], suite: Suite) -> str:
    """The results block: provenance, the selection table, the evaluation table and
    the bars."""
    mc = f"MC [{winner}]"
    selection = suite.regimes("selection")
    lines = [
        f"Commit {git_commit() or 'unknown'}; {machine_text()}; torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); {suite.runs} runs, {suite.run_seconds / 60:.0f} min of run time "
        f"in all; {suite.mode.seeds} seed(s); `robust-pfl reproduce mc-regimes`.",
        "",
        "Selection (final validation accuracy %, mean over seeds; worst ARI: the lowest of the regimes' mean "
        f"final ARIs; the winner has the highest mean among the candidates whose worst ARI is at least {ARI_BAR}):",
        "",
        "| candidate | " + " | ".join(regime.name for regime in selection) + " | mean | worst ARI |",
        "|---" * (len(selection) + 3) + "|",
    ]
    for label, per_regime in scores.items():
        cells = [_percent(per_regime[regime.name]) for regime in selection] + [
            _percent(per_regime["mean"]), _ari(per_regime["worst ARI"])]
        name = f"**{label}**" if label == winner else label
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Chosen: **{winner}**" + (" (the package default)." if winner == "default" else
                                   " (not the package default: the defaults are not the selection's choice)."),
        "",
        "Evaluation (final test accuracy %, mean over seeds; ARI of the honest clients; re-seeds per run):",
        "",
        f"| regime | rounds | {'MC (defaults)' if winner == 'default' else mc} | ARI | re-seeds | "
        "MC, Alg. 4 as printed | ARI | FC | FC models' ARI | Local |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    printed = "MC [Alg. 4 as printed]"
    for row in rows:
        lines.append(
            f"| {row['regime']} | {row['rounds']} | {_percent(row[mc]['test'])} | {_ari(row[mc]['ari'])} | "
            f"{_reseeds(row[mc]['reseeds'])} | {_percent(row[printed]['test'])} | {_ari(row[printed]['ari'])} | "
            f"{_percent(row['FC']['test'])} | {_ari(row['FC']['ari'])} | {_percent(row['Local']['test'])} |")
    lines += ["", "Bars (MC at least Local, within 5 points of FC, ARI at least 0.8 where FC's models' is):", ""]
    lines += verdicts(rows, winner)
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- mc-regimes:begin -->", "<!-- mc-regimes:end -->"


def write_block(target: Path, block: str) -> None:
    """Replace the marked block of ``target`` with ``block`` (the markers are kept)."""
    text = target.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{target}: no {BEGIN} ... {END} block to replace")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    target.write_text(f"{head}{BEGIN}\n{block}{END}{tail}")


def main(out: Path, quick: bool = False, seeds: int | None = None, page_path: Path | None = None) -> int:
    """Run the suite (resuming), write ``OUT/mc_regimes.md`` and ``summary.json``,
    and with ``page_path`` its marked block.  Returns 0 (the bars are reported, not
    enforced: a miss is a finding)."""
    mode = QUICK if quick else FULL
    if seeds is not None:
        mode = Mode(seeds, mode.round_scale, mode.regimes_per_role)
    suite = Suite(Path(out), mode)
    winner, scores = select(suite)
    rows = evaluate(suite, winner)
    text = page(winner, scores, rows, suite)
    if quick:
        text = f"{QUICK_SENTENCE}\n\n{text}"
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "mc_regimes.md").write_text(text)
    (Path(out) / "summary.json").write_text(json.dumps({"winner": winner, "selection": scores, "evaluation": rows},
                                                        indent=2))
    if page_path is not None:
        write_block(Path(page_path), text)
    print(text)
    return 0
