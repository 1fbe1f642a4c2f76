"""Reproduce Werner et al. Fig. 6 (Sec. 4.4): Federated-Clustering under Byzantine attack.

MNIST private label (label ``y -> (y + k) mod 10`` in cluster ``k``), K = 4 clusters of
50 honest clients, Byzantine clients added, two panels:

* **large gradient**: every Byzantine coordinate ``randn * 200 + 1e6``, drawn afresh for
  each receiver; 30 steps, as the official run;
* **bit flip**: one vector, minus client 0's gradient at client 0's own model, sent to
  every receiver (``source = "client_model"``); the official run is 100 epochs of 30
  batches (3,000 steps), ``--quick`` runs the first 10 epochs (300 steps).

Two placements of the Byzantine clients: the official run's 50 in total, spread
round-robin over the clusters (N = 250), and the paper text's 50 per cluster (N = 400).
Methods: FC with the official run's settings (10 clustering rounds, 20% quantile radius
by the official rule, one group, heavy-ball 0.9) against Global (FedAvg) and Global with
each classic robust aggregator (f = the Byzantine count, capped at the largest value the
rule accepts); FC and Global without Byzantine clients are the reference, evaluated at
every step that FC is evaluated at in each panel (:func:`reference_plan`). Everything
else is the official MNIST setting (docs/official_code.md): MLP 784-200-10 with the
softmax + NLL loss, inputs normalised, SGD lr 0.1 with momentum 0.9, batch 32, the train
set dealt afresh every epoch.

The figure runs as a grid (:mod:`robust_pfl.grid`) in ``OUT/grid``: a killed run
resumes without losing finished cells, and the long bit-flip cells checkpoint every
official epoch, so they resume mid-run.  The claim checked (and the exit status): with
the official placement, FC's final honest test accuracy under each attack is within
``FC_TOLERANCE`` points of FC without Byzantine clients and at least ``GLOBAL_MARGIN`` points above
Global's under the same attack.  The paper-text placement is reported as measured.

Without ``--data-dir`` the same protocol runs on the embedded scikit-learn digits at a
size the digits can deal (10 honest clients per cluster, 10 Byzantine in total or per
cluster, batch 16) and with 150 large-gradient steps (after 30, FC without Byzantine
clients is at 43% on the digits, far from converged): no files needed, no paper scale.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from robust_pfl.backends import Backend
from robust_pfl.engine.devices import describe_device
from robust_pfl.grid import grid_results, run_grid
from robust_pfl.pages import grid_cells
from robust_pfl.grid_file import Grid, GridCell, expand_grid
from robust_pfl.recipes import QUICK_SENTENCE
from robust_pfl.engine.results import close_figure, png_writer, write_outputs

FC_TOLERANCE = 3.0  # points
GLOBAL_MARGIN = 30.0  # points
OPTIMISER = {"lr": 0.1, "heavy_ball": 0.9}
FC = {
    "name": "fc",
    "label": "FC",
    "groups": 1,
    "clustering_rounds": 10,
    "radius": {"policy": "quantile", "q": 0.2, "rule": "official"},
}
ATTACKS = {
    "large_gradient": {"name": "large_gradient", "mean": 1e6, "std": 200.0},
    "bit_flip": {"name": "bit_flip", "source": "client_model", "client": 0},
}
PLACEMENTS = ("official", "paper_text")
PANELS = tuple(ATTACKS)
#: The attack label of the runs without Byzantine clients; a reference that serves one
#: panel only reads ``reference (PANEL)`` (:func:`reference_plan`).
REFERENCE = "reference"


@dataclass(frozen=True)
class Scale:
    """The federation and the panels' lengths."""

    dataset: str
    clients_per_cluster: int
    byzantine: int  # in total (official) or per cluster (paper text)
    batch: int
    large_gradient_steps: int
    bit_flip_steps: int
    checkpoint_every: int  # rounds (one official epoch)


MNIST = Scale("mnist", 50, 50, 32, large_gradient_steps=30, bit_flip_steps=3000, checkpoint_every=30)
DIGITS = Scale("digits", 10, 10, 16, large_gradient_steps=150, bit_flip_steps=3000, checkpoint_every=30)
QUICK_BIT_FLIP_STEPS = 300  # the first 10 official epochs


def aggregators(byzantine: int, clients: int) -> dict[str, dict[str, Any] | str]:
    """Global's aggregators for ``byzantine`` of ``clients``: Krum and the trimmed mean
    get ``f`` = the Byzantine count, capped where the rule needs ``n > 2f + 2`` /
    ``n > 2f``."""
    krum_f = max(0, min(byzantine, (clients - 3) // 2))
    trim_f = max(0, min(byzantine, (clients - 1) // 2))
    return {
        "Global": "mean",
        "Global+median": "median",
        "Global+trimmed_mean": {"name": "trimmed_mean", "f": trim_f},
        "Global+krum": {"name": "krum", "f": krum_f},
        "Global+geometric_median": "geometric_median",
        "Global+centered_clipping": {"name": "centered_clipping", "tau": 10.0},
    }


def methods(byzantine: int, clients: int, with_aggregators: bool = True) -> list[dict[str, Any]]:
    out = [{**FC, **OPTIMISER}]
    chosen = aggregators(byzantine, clients) if with_aggregators else {"Global": "mean"}
    for label, aggregator in chosen.items():
        out.append({"name": "global", "label": label, "aggregator": aggregator, **OPTIMISER})
    return out


def task(scale: Scale, data_dir: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "image",
        "dataset": scale.dataset,
        "kind": "private_label",
        "clusters": 4,
        "clients_per_cluster": scale.clients_per_cluster,
        "partition": "official",
        "reshuffle_every_epoch": True,
        "model": {"name": "mlp", "hidden": [200], "loss": "softmax_nll"},
    }
    if scale.dataset == "mnist":
        spec.update(data_dir=data_dir, normalize="mnist")
    return spec


def placement(name: str, scale: Scale) -> dict[str, int]:
    return {"total": scale.byzantine} if name == "official" else {"per_cluster": scale.byzantine}


def panel_steps(panel: str, scale: Scale, quick: bool) -> int:
    if panel == "large_gradient":
        return scale.large_gradient_steps
    return QUICK_BIT_FLIP_STEPS if quick else scale.bit_flip_steps


def base(scale: Scale, data_dir: str | None, steps: int, device: str | None = None) -> dict[str, Any]:
    long = steps > scale.checkpoint_every
    return {
        **({} if device is None else {"device": device}),
        "seeds": [0],
        "rounds": steps,
        "eval_every": scale.checkpoint_every if long else 3,
        "batch_size": scale.batch,
        "task": task(scale, data_dir),
        **({"checkpoint_every": scale.checkpoint_every} if long else {}),
    }


def evaluation_rounds(rounds: int, eval_every: int) -> set[int]:
    """The steps a run of ``rounds`` evaluates at: 0, every ``eval_every``, the last
    (:func:`robust_pfl.experiments.run_method`)."""
    return {0, rounds, *range(eval_every, rounds + 1, eval_every)}


def reference_label(panel: str, shared: bool) -> str:
    return REFERENCE if shared else f"{REFERENCE} ({panel})"


def is_reference(label: str) -> bool:
    return label == REFERENCE or label.startswith(f"{REFERENCE} (")


def reference_plan(scale: Scale, quick: bool, panels: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """Which run without Byzantine clients serves each panel: ``{panel: (label,
    steps)}``, the longest panel first (its reference's label and length).

    A panel's reference must be evaluated at every step its FC is evaluated at, so
    that the figure draws both at the same steps and the claim compares FC with the
    reference at FC's last step.  The longest panel's length gives the shared
    reference (label ``reference``), which serves every panel whose evaluation steps it
    holds (a shorter panel with the same ``eval_every``); a panel evaluated more often
    (MNIST's 30-step large-gradient panel, every 3 steps, against every official epoch
    of 30 steps on the long bit-flip panel) gets its own reference at its own length,
    ``reference (PANEL)``."""
    ordered = sorted(panels, key=lambda panel: panel_steps(panel, scale, quick), reverse=True)
    references: dict[str, set[int]] = {}
    plan: dict[str, tuple[str, int]] = {}
    for panel in ordered:
        steps = panel_steps(panel, scale, quick)
        needed = evaluation_rounds(steps, base(scale, None, steps)["eval_every"])
        serving = next((label for label, held in references.items() if needed <= held), None)
        if serving is None:
            serving = reference_label(panel, shared=not references)
            references[serving] = needed
        plan[panel] = (serving, max(references[serving]))
    return plan


def grids(
    scale: Scale, data_dir: str | None, quick: bool, panels: tuple[str, ...], device: str | None = None
) -> list[Grid]:
    """One grid per (panel, placement) plus the references without Byzantine clients
    (:func:`reference_plan`: one at the longest panel's length, whose history gives FC
    and Global at every step of a panel evaluated as often, and one per panel that is
    evaluated more often).  The panel and the placement name the cells through the
    ``label`` of their one-value ``attack`` and ``byzantine`` axes, so they are columns
    of the store."""
    honest = 4 * scale.clients_per_cluster
    references = dict(reference_plan(scale, quick, panels).values())  # label: steps, the longest first
    out = []
    for label, steps in references.items():
        reference = {
            **base(scale, data_dir, steps, device),
            "methods": methods(0, honest, with_aggregators=False),
            "grid": {"attack": [{"name": "none", "label": label}]},
        }
        out.append(expand_grid(reference, f"fig6 {label}"))
    for panel in panels:
        steps = panel_steps(panel, scale, quick)
        for name in PLACEMENTS:
            byzantine = scale.byzantine if name == "official" else 4 * scale.byzantine
            config = {
                **base(scale, data_dir, steps, device),
                "methods": methods(byzantine, honest + byzantine),
                "grid": {
                    "attack": [{**ATTACKS[panel], "label": panel}],
                    "byzantine": [{**placement(name, scale), "label": name}],
                },
            }
            out.append(expand_grid(config, f"fig6 {panel} {name}"))
    return out


def merged(parts: list[Grid], source: str) -> Grid:
    """One grid of ``parts``' cells, the longest first (:func:`longest_first`)."""
    columns = list(dict.fromkeys(column for grid in parts for column in grid.columns))
    cells = longest_first([cell for grid in parts for cell in grid.cells])
    return Grid(source, columns, cells, parts[0].resources)


def longest_first(cells: list[GridCell]) -> list[GridCell]:
    """FC's cells first, the most client-steps first; the others in their order.

    An FC step costs about a hundred Global steps (every receiver clusters all
    senders), so the FC cells are the grid's long ones: started first, they leave the
    short cells to fill the other workers, and no worker runs one long cell alone at
    the end (longest-processing-time-first scheduling)."""

    def fc_work(cell: GridCell) -> int:
        is_fc = any(method["name"] == "fc" for method in cell.config["methods"])
        return cell.config["rounds"] * cell.n_clients if is_fc else 0

    return sorted(cells, key=fc_work, reverse=True)  # stable: ties keep their order


@dataclass(frozen=True)
class Final:
    panel: str
    placement: str
    method: str
    accuracy: float  # percent
    rounds: int


def finals(frame: pd.DataFrame) -> list[Final]:
    ok = frame[(frame["metric"] == "test_accuracy") & frame["final"]]
    out = []
    for _, row in ok.iterrows():
        placement_name = row.get("byzantine", "none")
        out.append(
            Final(
                str(row["attack"]),
                "none" if pd.isna(placement_name) else str(placement_name),
                str(row["method"]),
                100 * float(row["value"]),
                int(row["round"]),
            )
        )
    return out


def panel_reference(frame: pd.DataFrame, panel: str) -> str:
    """The attack label of the reference that serves ``panel`` in ``frame``: its own
    (``reference (PANEL)``) where the store holds one, else the shared one."""
    own = reference_label(panel, shared=False)
    return own if (frame["attack"] == own).any() else REFERENCE


def accuracy_at(frame: pd.DataFrame, method: str, step: int, panel: str | None = None) -> float | None:
    """The no-attack reference's honest test accuracy (%) of ``method`` at ``step``
    (the reference serving ``panel``, default the shared one)."""
    label = REFERENCE if panel is None else panel_reference(frame, panel)
    rows = frame[
        (frame["attack"] == label)
        & (frame["method"] == method)
        & (frame["metric"] == "test_accuracy")
        & (frame["round"] == step)
    ]
    return None if rows.empty else 100 * float(rows["value"].iloc[0])


def checks(frame: pd.DataFrame, results: list[Final]) -> list[dict[str, Any]]:
    """The claim, per attack, on the official placement."""
    out = []
    for panel in sorted({r.panel for r in results if not is_reference(r.panel)}):
        rows = {r.method: r for r in results if r.panel == panel and r.placement == "official"}
        if "FC" not in rows or "Global" not in rows:
            continue
        fc, global_ = rows["FC"], rows["Global"]
        clean = accuracy_at(frame, "FC", fc.rounds, panel)
        out.append({
            "attack": panel,
            "rounds": fc.rounds,
            "fc": fc.accuracy,
            "fc_without_attack": clean,
            "global": global_.accuracy,
            "fc_holds": clean is not None and abs(fc.accuracy - clean) <= FC_TOLERANCE,
            "beats_global": fc.accuracy - global_.accuracy >= GLOBAL_MARGIN,
        })
    return out


def markdown(results: list[Final], claim_rows: list[dict[str, Any]], decided: bool = True) -> str:
    """The table and, per attack, FC against FC without Byzantine clients and Global,
    with the claim's verdict unless not ``decided`` (quick mode)."""
    labels = list(dict.fromkeys(r.method for r in results))
    columns = [(p, q) for p in PANELS for q in PLACEMENTS if any(r.panel == p and r.placement == q for r in results)]
    head = "| method | " + " | ".join(f"{p} ({q})" for p, q in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    for method in labels:
        cells = []
        for panel, name in columns:
            match = [r for r in results if r.method == method and r.panel == panel and r.placement == name]
            cells.append(f"{match[0].accuracy:.1f}" if match else "–")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    for claim in claim_rows:
        clean = claim["fc_without_attack"]
        if not decided:
            lines.append(
                f"\n{claim['attack']} (official placement, {claim['rounds']} steps): FC {claim['fc']:.1f}% "
                f"against {clean if clean is None else f'{clean:.1f}'}% without Byzantine clients, "
                f"Global {claim['global']:.1f}%"
            )
            continue
        lines.append(
            f"\n{claim['attack']} (official placement, {claim['rounds']} steps): FC {claim['fc']:.1f}% "
            f"against {clean if clean is None else f'{clean:.1f}'}% without Byzantine clients "
            f"({'within' if claim['fc_holds'] else 'NOT within'} {FC_TOLERANCE:g} points), Global "
            f"{claim['global']:.1f}% ({'at least' if claim['beats_global'] else 'NOT'} {GLOBAL_MARGIN:g} points below FC)"
        )
    return "\n".join(lines)


#: How each line of the figure is drawn: FC and its reference thick and saturated,
#: Global and its reference in a second strong colour, the robust aggregators thin and
#: muted; every line has its own marker, one at each evaluation.
EMPHASIS = {
    "FC": {"color": "#1f5fbf", "linewidth": 2.6, "marker": "o", "zorder": 6},
    "Global": {"color": "#d95f02", "linewidth": 1.8, "marker": "^", "zorder": 5},
}
MUTED = ("#8fbf8f", "#c9a0dc", "#b8a48a", "#e8a0b8", "#9ab8c8", "#c8c880")
MUTED_MARKERS = ("D", "P", "X", "*", "h", "v")
REFERENCE_STYLE = {"linestyle": (0, (4, 2)), "markerfacecolor": "white"}
#: Above this many evaluations on a line, markers go on every k-th one only.
MAX_MARKERS = 40


def line_styles(methods: list[str]) -> dict[str, dict[str, Any]]:
    """Plot keywords of each method under attack (:data:`EMPHASIS`, else muted)."""
    out, muted = {}, 0
    for method in methods:
        if method in EMPHASIS:
            out[method] = {**EMPHASIS[method], "linestyle": "-"}
        else:
            out[method] = {"color": MUTED[muted % len(MUTED)], "marker": MUTED_MARKERS[muted % len(MUTED_MARKERS)],
                           "linewidth": 1.1, "linestyle": "-", "markersize": 4, "zorder": 3}
            muted += 1
    return out


def placement_title(name: str, part: pd.DataFrame) -> str:
    """``official`` / ``paper_text`` with the Byzantine count where the store has it."""
    count = ""
    if "n_byzantine" in part and len(part):
        count = f"{int(part['n_byzantine'].iloc[0])} Byzantine clients"
    if name == "official":
        return f"{count or 'Byzantine clients'} in total (official run)"
    if name == "paper_text":
        return f"{count + ', ' if count else ''}per cluster (paper text)"
    return name.replace("_", " ")


def plot(frame: pd.DataFrame, dataset: str) -> Any:
    """Small multiples of the paper's figure: one panel per (placement, attack), rows
    the placements, columns the attacks; honest test accuracy against steps.  In each
    panel FC (thick, blue) and FC without Byzantine clients (thick, blue, dashed, open
    markers) lead, Global and Global without Byzantine clients (orange) follow, and the
    robust aggregators are thin muted lines; every line has a marker at each
    evaluation and a legend entry.  The reference drawn is the one serving the panel
    (:func:`panel_reference`), evaluated at FC's steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    accuracy = frame[frame["metric"] == "test_accuracy"]
    panels = [p for p in PANELS if (accuracy["attack"] == p).any()]
    attacked = accuracy[accuracy["attack"].isin(panels)]
    placements = [q for q in PLACEMENTS if (attacked["byzantine"] == q).any()] or [None]
    canonical = [FC["label"], *aggregators(0, 3)]  # FC, Global, the aggregators: same colours in every run
    methods = sorted(dict.fromkeys(attacked["method"]),
                     key=lambda m: (canonical.index(m) if m in canonical else len(canonical), m))
    styles = line_styles(methods)
    figure, axes = plt.subplots(len(placements), max(1, len(panels)), squeeze=False, sharey=True,
                                figsize=(5.4 * max(1, len(panels)), 3.4 * len(placements) + 1.0))
    evaluations = 0
    for column, panel in enumerate(panels):
        rows = attacked[attacked["attack"] == panel]
        last = rows["round"].max()
        clean = accuracy[(accuracy["attack"] == panel_reference(frame, panel)) & (accuracy["round"] <= last)]
        for row, name in enumerate(placements):
            axis = axes[row][column]
            part = rows if name is None else rows[rows["byzantine"] == name]
            lines = [(method, method, styles[method], group)
                     for method, group in part.groupby("method", sort=False)]
            lines += [(method, f"{method}, no Byzantine clients", {**styles[method], **REFERENCE_STYLE,
                       "zorder": styles[method]["zorder"] + 1}, group)
                      for method, group in clean.groupby("method", sort=False) if method in styles]
            for _, label, style, group in lines:
                group = group.sort_values("round")
                evaluations = max(evaluations, len(group))
                every = max(1, -(-len(group) // MAX_MARKERS))
                axis.plot(group["round"], 100 * group["value"], label=label, markevery=every,
                          **{"markersize": 5.5, **style})
            axis.set_title(f"{panel.replace('_', ' ')} attack\n{placement_title(name, part)}" if name else
                           f"{panel.replace('_', ' ')} attack", fontsize=10)
            axis.set_xlabel("Step")
            axis.set_ylim(0, 100)
            axis.grid(alpha=0.3)
            if column == 0:
                axis.set_ylabel("Honest test accuracy (%)")
    handles: dict[str, Any] = {}
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    # FC under attack, FC without Byzantine clients, Global ..., then the aggregators
    order = [label for method in methods for label in (method, f"{method}, no Byzantine clients") if label in handles]
    columns = max(1, min(5, -(-len(order) // 2)))  # FC's two lines in the first column, Global's in the second
    legend_rows = -(-len(order) // columns)
    figure.legend([handles[label] for label in order], order, loc="lower center", ncol=columns, fontsize=8,
                  frameon=False)
    markers = "a marker at each evaluation" if evaluations <= MAX_MARKERS else "markers on every few evaluations"
    figure.suptitle(f"Werner et al. Fig. 6 on {dataset}, private label: rows the Byzantine placement, columns "
                    f"the attack\nsolid: under attack; dashed with open markers: the run without Byzantine clients; "
                    f"{markers}", fontsize=10)
    height = figure.get_figheight()
    figure.tight_layout(rect=(0, (0.25 + 0.2 * legend_rows) / height, 1, 1))
    return figure


def main(
    out: Path,
    quick: bool = False,
    data_dir: str | None = None,
    panels: tuple[str, ...] = PANELS,
    backend: Backend | None = None,
    device: str | None = None,
) -> int:
    """Run (or resume) the figure's grid on ``device`` (default: the CPU); write
    ``fig6.md``, ``fig6.png``, ``summary.json``; return 1 when the claim fails on the
    official placement.  ``quick``: a smoke run that decides no claim (``holds`` is
    ``None``); it returns 1 only when a cell errored."""
    scale = DIGITS if data_dir is None else MNIST
    start = time.perf_counter()
    grid = merged(grids(scale, data_dir, quick, panels, device), "reproduce fig6")
    ran = run_grid(grid, out / "grid", backend)
    errors = ran["errored"]
    frame = grid_results(out / "grid", grid)
    results = finals(frame)
    claim_rows = checks(frame, results)
    seconds = time.perf_counter() - start
    # every requested panel must have been checked: an errored cell fails the claim
    holds = not errors and len(claim_rows) == len(panels) and all(c["fc_holds"] and c["beats_global"] for c in claim_rows)
    if quick:  # a smoke run: it ran (no cell errored) or not; it decides no claim
        holds = None
    dataset = "MNIST" if data_dir is not None else "embedded digits (reduced scale, no paper numbers)"
    lengths = ", ".join(
        f"{panel.replace('_', ' ')} {panel_steps(panel, scale, quick)} steps"
        + (" (quick: the first 10 official epochs)" if quick and panel == "bit_flip" else "")
        for panel in panels
    )
    header = (
        f"Fig. 6 on {dataset}: final honest test accuracy (%), {scale.clients_per_cluster} honest clients per "
        f"cluster, K = 4; {lengths}. {seconds:.0f} s in this call."
    )
    figure = plot(frame, "MNIST" if data_dir is not None else "the embedded digits")
    summary = {
        "dataset": dataset,
        "quick": quick,
        "panels": list(panels),
        "final": [vars(r) for r in results],
        "checks": claim_rows,
        "holds": holds,
        "errored": errors,
        "seconds": seconds,
        "cells": grid_cells([ran]),
        "device": describe_device(grid.cells[0].config["device"]),
    }
    body = markdown(results, claim_rows, decided=not quick)
    if quick:
        body += f"\n\n{QUICK_SENTENCE}."
    if errors:
        body += "\n\nErrored cells (rerun to retry them): " + "; ".join(f"{k}: {v}" for k, v in errors.items())
    try:
        write_outputs(out, summary, {
            "fig6.md": header + "\n\n" + body + "\n",
            "fig6.png": png_writer(figure, bbox_inches="tight"),
        })
    finally:
        close_figure(figure)
    print(header, body, sep="\n\n")
    print(f"wrote {out / 'fig6.md'}, {out / 'fig6.png'}, {out / 'summary.json'}")
    if quick:
        return 1 if errors else 0
    return 0 if holds else 1

