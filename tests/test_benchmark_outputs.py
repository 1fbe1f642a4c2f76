"""A benchmark's outputs (issue 53, items 2, 6-8): the vacuous flag and the other
reasons for no verdict in every output (tables, CSVs, figures, the best-defense
table); the cost estimate's rule on a hand-made plan; the ball counts and the reading
of a break against Thm 3.1 on hand-made numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from defenses.ball_diagnostics import ball_metrics, ball_rows
from defenses.radius import FixedRadius
from robust_pfl.worst_case import analysis, cost, figures, report, theorem
from robust_pfl.worst_case.allocation import Final, Rule, Runs
from robust_pfl.worst_case.plan import Plan

from test_benchmark_verdicts import LEVEL, SEEDS, key, judge, plan_of, runs_of, states_of


# -- the vacuous flag in every output ------------------------------------------------------------
@pytest.fixture(scope="module")
def judged():
    """D: clean 0.5 against Local's 0.45 (vacuous); E: clean 0.9, broken at 0.2;
    Local: the reference."""
    table = {key("D", "x", 0.0, "none"): [(0.5, 0.5)] * 4, key("Local", "x", 0.0, "none"): [(0.45, 0.45)] * 4,
             key("E", "x", 0.0, "none"): [(0.9, 0.9)] * 4}
    table.update({key(m, "x", 0.2, "a"): [(0.3, 0.3), (0.31, 0.31), (0.29, 0.29), (0.3, 0.3)]
                  for m in ("D", "Local", "E")})
    runs = runs_of(table)
    states = states_of(runs, ["D", "Local", "E"], [0.0, 0.2])
    j = judge(references=frozenset({"Local"}))
    plan = plan_of({(m, f): {"x": ["none" if f == 0 else "a"]} for m in ("D", "Local", "E") for f in (0.0, 0.2)})
    worst = analysis.worst_case_table(runs, plan, states, j)
    return worst, analysis.breakdown(runs, states, j, [0.0, 0.2]), analysis.best_defense(worst), j


def test_the_vacuous_flag_is_in_the_csvs(judged):
    worst, breakdown, best, _ = judged
    rows = breakdown.set_index("method")
    assert bool(rows.loc["D", "vacuous"]) and not bool(rows.loc["E", "vacuous"])
    assert rows.loc["Local", "status"] == analysis.REFERENCE and rows.loc["E", "verdict"] == "breaks at f = 0.2"
    assert set(worst.loc[worst["method"] == "D", "status"]) == {analysis.VACUOUS}
    assert "vacuous" in worst.to_csv(index=False) and "vacuous" in breakdown.to_csv(index=False)
    assert "status" in best.columns


def test_the_vacuous_flag_is_in_the_tables(judged):
    worst, _, _, j = judged
    for fmt in ("md", "latex"):
        text = report.render_worst_case(worst, [0.0, 0.2], [LEVEL], ["D", "E", "Local"], pd.DataFrame(), j.rule, fmt)
        assert "D (vacuous: no verdict)" in text and "Local (reference: no verdict)" in text
        assert "E (" not in text and "breaks" in text  # a decided cell is marked, the vacuous ones are not
    d_row = next(line for line in report.render_worst_case(worst, [0.0, 0.2], [LEVEL], ["D"], pd.DataFrame(), j.rule,
                                                           "md").splitlines() if line.startswith("| D"))
    assert "breaks" not in d_row and "holds" not in d_row


def test_the_vacuous_flag_is_in_the_best_defense_table(judged):
    worst, _, best, _ = judged
    vacuous_best = analysis.best_defense(worst[worst["method"] != "E"])
    header, rows, _ = report.best_cells(vacuous_best, [0.0, 0.2], [LEVEL])
    assert any("vacuous" in cell for cell in rows[0][1:])
    header, rows, _ = report.best_cells(best, [0.0, 0.2], [LEVEL])
    assert "E (" in rows[0][1]


def test_the_vacuous_flag_is_in_the_figures(judged):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worst, _, best, _ = judged
    figure = figures.heatmaps_figure(worst, ["D", "E", "Local"], [LEVEL], [0.0, 0.2])
    titles = {ax.get_title() for ax in figure.axes}
    assert "D\n(vacuous: no verdict)" in titles and "E" in titles and "Local\n(reference: no verdict)" in titles
    hatched = [p for ax in figure.axes if ax.get_title().startswith("D") for p in ax.patches if p.get_hatch()]
    assert hatched  # the vacuous defense's cells are hatched
    assert any(getattr(ax, "get_label", lambda: "")() == "<colorbar>" for ax in figure.axes)  # a colour bar
    plt.close(figure)
    lines = figures.lines_figure(worst, ["D", "E", "Local"], [LEVEL], [0.0, 0.2])
    styles = {ax.get_title(): [line.get_linestyle() for line in ax.get_lines()] for ax in lines.axes}
    assert "--" in styles["D"] and "--" not in styles["E"]  # dashed: no verdict
    plt.close(lines)
    best_figure = figures.best_figure(analysis.best_defense(worst[worst["method"] != "E"]), [LEVEL], [0.0, 0.2])
    assert any("vacuous" in text.get_text() for ax in best_figure.axes for text in ax.texts)
    plt.close(best_figure)


def test_labels_are_drawn_as_text_not_tex():
    assert figures._text("$\\frac{1}{2}$") == "\\$\\frac{1}{2}\\$"


# -- the cost estimate's rule ----------------------------------------------------------------------
def test_the_cost_estimate_follows_its_rule_on_a_hand_made_plan(monkeypatch):
    """One attacked cell (candidates x, the reference, and y; four attacks of 1 s, one
    backdoor of 2 s) and its clean cell (runs of 0.5 s); seeds 4, two to start.  By the
    rule (robust_pfl.worst_case.cost), with 30% of the attacks surviving (1.2):
    attacked: reference 2 x 4 = 8 (the first stage), y on the survivors 2 x 1.2 = 2.4,
    one more seed while both race 1 x (1.2 + 1.2) = 2.4, the chosen y (probability 1/2)
    screening the 2.8 dropped 0.5 x 2 x 2.8 = 2.8, one verdict seed 1.2, backdoors
    2 x 2 = 4: 20.8; clean: 2 x 0.5 + 2 x 0.5 + 1 x (0.5 + 0.5) = 3.  Full factorial:
    4 x (2 x 6 + 2 x 0.5) = 52."""
    plan = plan_of({("D", 0.0): {"x": ["none"], "y": ["none"]},
                    ("D", 0.2): {"x": ["a", "b", "c", "e"], "y": ["a", "b", "c", "e"]}},
                   backdoors={("D", 0.2): ["bd"]})
    prices = {}
    for (group, candidate), attacks in [*plan.attacks.items(), *plan.backdoors.items()]:
        for attack in attacks:
            combo = key("D", candidate, group[2], attack)
            plan.combos[combo] = SimpleNamespace(key=combo)
            prices[combo] = 0.5 if group[2] == 0 else (2.0 if attack == "bd" else 1.0)
    monkeypatch.setattr(cost, "run_seconds", lambda combo: prices[combo.key])
    found = cost.estimate(plan, Rule(SEEDS[:4], 2))
    assert found.first == pytest.approx(8 + 1) and found.full == pytest.approx(52)
    assert found.seconds == pytest.approx(20.8 + 3)
    unraced = cost.estimate(plan, Rule(SEEDS[:4], 2, racing=False))
    # every candidate every attack with two seeds (16 + 2), backdoors 2 x (2 + 2), one verdict seed 4
    assert unraced.first == pytest.approx(18) and unraced.seconds == pytest.approx(18 + 8 + 4)
    assert "with 2 workers" in found.text(2) and "first stage" in found.text(2)


def test_one_runs_estimate_reads_its_datasets_calibration_by_hand(monkeypatch):
    """seconds = overhead + (rounds x per round + evaluations x per evaluation) x scale.
    A 25-round run evaluated every 10 rounds has metrics at rounds 0, 10, 20, 25 (4).
    MNIST's own entry: FC under alie 2 + 25 x 0.3 + 4 x 0.5 = 11.5; an attack the entry
    lacks costs as the plain one, 2 + 25 x 0.1 + 4 x 0.5 = 6.5; a method it lacks takes
    its model round (0.02) times the entry's ratios (10 and 50), 2 + 25 x 0.2 + 4 x 1 = 11.
    A dataset without an entry borrows the digits entry scaled by the model rounds
    (0.03 / 0.01 = 3): 1 + (25 x 0.2 + 4 x 0.1) x 3 = 17.2."""
    entry = {"overhead_seconds": 2.0, "per_round": {"fc": {"gaussian_noise": 0.1, "alie": 0.3}},
             "per_evaluation": {"fc": 0.5}, "model_round": {"fc": 0.01}}
    digits = {"overhead_seconds": 1.0, "per_round": {"fc": {"gaussian_noise": 0.2}},
              "per_evaluation": {"fc": 0.1}, "model_round": {"fc": 0.01}}
    monkeypatch.setattr(cost, "calibration", lambda: {"tasks": {"mnist": entry, "digits": digits}})

    def run(dataset, method, attack, model_round):
        config = SimpleNamespace(task=SimpleNamespace(name="image", dataset=dataset), eval_every=10,
                                 attack=SimpleNamespace(name=attack))
        monkeypatch.setattr(cost, "method_key", lambda combo: method)
        monkeypatch.setattr(cost, "_model_round", lambda combo: model_round)
        return cost.run_seconds(SimpleNamespace(config=config, rounds=25))

    assert [cost.evaluations(25, 10), cost.evaluations(20, 10), cost.evaluations(1, 1)] == [4, 3, 2]
    assert run("mnist", "fc", "alie", 0.01) == pytest.approx(11.5)
    assert run("mnist", "fc", "ipm", 0.01) == pytest.approx(6.5)
    assert run("mnist", "mc", "alie", 0.02) == pytest.approx(11.0)
    assert run("cifar10", "fc", "alie", 0.03) == pytest.approx(17.2)


# -- the theorem's hypotheses, read from hand-made numbers -------------------------------------
def test_ball_rows_count_by_hand():
    """Points on a line, centre 0, radius 1.5: 0.5 and -1 (own cluster), 1.2 (other
    cluster) and 1.4, 3 (Byzantine; 3 is outside)."""
    points = torch.tensor([[[0.5], [-1.0], [1.2], [1.4], [3.0], [9.0]]], dtype=torch.float64)
    centres = torch.zeros(1, 1, 1, dtype=torch.float64)
    byzantine = torch.tensor([[False, False, False, True, True, False]])
    own = torch.tensor([[[True, True, False, False, False, True]]])
    rows = ball_rows(points, centres, FixedRadius(tau=1.5), 0, byzantine, own)
    assert rows.tolist() == [[1.5, 2.0, 1.0, 1.0, 3.0]]
    metrics = ball_metrics(rows)
    assert metrics["ball_byzantine_ratio"] == 0.5 and metrics["ball_byzantine_share"] == pytest.approx(0.25)
    assert metrics["ball_own_inside"] == pytest.approx(2 / 3)
    empty = ball_rows(points, centres, FixedRadius(tau=0.1), 0, byzantine, own)
    assert ball_metrics(empty)["ball_byzantine_ratio"] == 0.0
    only_byzantine = torch.tensor([[1.5, 0.0, 0.0, 2.0, 3.0]], dtype=torch.float64)
    assert ball_metrics(only_byzantine)["ball_byzantine_ratio"] == math.inf


def test_a_break_is_read_inside_or_outside_the_theorem():
    combo = SimpleNamespace(config=SimpleNamespace(methods=[SimpleNamespace(name="fc")],
                                                   task=SimpleNamespace(clients_per_cluster=10)),
                            n_clients=25, n_byzantine=5)
    breaking = ("FC", "x", LEVEL, 0.2, "ball_edge")
    plan = SimpleNamespace(combos={breaking: combo})
    item = theorem.Diagnostic(breaking, ("FC", "x (theorem diagnostic)", LEVEL, 0.2, "ball_edge"), {})
    # delta = 0.4, beta = 0.2; sigma = 0.5, Delta = 5: tau* = sqrt(0.4 * 0.5 * 5) = 1; separation 5 * 0.4 / 0.5 = 4
    inside = {"method": "FC", "candidate": item.key[1], "heterogeneity": LEVEL, "fraction": 0.2, "attack": "ball_edge",
              "theory_sigma2_batch": 0.25, "theory_Delta2": 25.0, "ball_radius": 2.0, "ball_byzantine_ratio": 0.5,
              "ball_byzantine_share": 0.2}
    rows = theorem.readings(pd.DataFrame([inside]), [item], plan).iloc[0]
    assert rows["theorem_radius"] == pytest.approx(1.0) and rows["separation"] == pytest.approx(4.0)
    assert rows["reading"].startswith("inside the hypotheses")
    outside = {**inside, "ball_byzantine_ratio": math.inf, "ball_radius": 50.0}
    reading = theorem.readings(pd.DataFrame([outside]), [item], plan).iloc[0]["reading"]
    assert reading.startswith("outside") and "Byzantine ratio in a ball inf" in reading and "radius 50 x" in reading
    unmeasured = {**inside, "ball_byzantine_ratio": math.nan, "ball_radius": math.nan}
    reading = theorem.readings(pd.DataFrame([unmeasured]), [item], plan).iloc[0]["reading"]
    assert reading.startswith("undetermined") and "Byzantine ratio" in reading and "radius" in reading
    assert theorem.readings(pd.DataFrame([{**unmeasured, "theory_Delta2": 0.01}]), [item], plan).iloc[0][
        "reading"].startswith("outside")  # a measured failure decides, the unmeasured ones are named
    no_sigma = theorem.readings(pd.DataFrame([{**inside, "theory_sigma2_batch": math.nan}]), [item], plan).iloc[0]
    assert no_sigma["reading"].startswith("undetermined") and "separation" in no_sigma["reading"]  # never a pass


def test_runs_are_read_from_finals_with_their_seeds():
    runs = Runs({(key("D", "x", 0.2, "a"), 3): Final(0.5, 1.0, 0.4, 0.3, 0.0)})
    assert runs.seeds_of(key("D", "x", 0.2, "a"), SEEDS) == [3]
    assert runs.values(key("D", "x", 0.2, "a"), [3], "test") == [0.4]
    assert isinstance(Plan, type)


def test_results_read_labels_back_as_written(judged, tmp_path):
    """``robust-pfl results OUT`` on a defense labelled "NA" and a level labelled "1"
    (which pandas would read as missing and as a number): the same table as rendered
    from the frame the benchmark wrote."""
    import json

    from robust_pfl.worst_case.plan import COLUMNS
    from robust_pfl.worst_case.results import worst_case_text
    from robust_pfl.worst_case.runner import RECORD

    worst, _, _, j = judged
    worst = worst.replace({"method": {"D": "NA"}, "heterogeneity": {LEVEL: "1"}})
    skipped = pd.DataFrame(columns=[*COLUMNS[:-1], "section", "reason"])
    worst.to_csv(tmp_path / "worst_case.csv", index=False)
    skipped.to_csv(tmp_path / "not_applicable.csv", index=False)
    defenses = ["NA", "E", "Local"]
    (tmp_path / RECORD).write_text(json.dumps({"fractions": [0.0, 0.2], "heterogeneity": ["1"], "defenses": defenses}))
    text = worst_case_text(tmp_path)
    assert text == report.render_worst_case(worst, [0.0, 0.2], ["1"], defenses, skipped, None, "md")
    row = next(line for line in text.splitlines() if line.startswith("| NA"))
    assert "–" not in row and "50.0" in row  # D's clean accuracy, read back under its label
