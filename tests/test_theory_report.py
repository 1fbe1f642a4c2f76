"""The theory report (theory_checks.report) and ``robust-pfl theory report`` on a fake
registry: every status and kind, a legend, contradictions flagged, every exponent's
verdict and direction, measured hypotheses, where false statements' proofs go wrong,
scaling figures drawn, strict JSON, and the CLI's exit rule."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import theory_checks.statements  # noqa: F401  registers the real statements before the fake ones replace them
from robust_pfl import cli
from theory_checks.report import contradicts_kind, write_report
from theory_checks.statements import registry
from theory_checks.statements.registry import Statement
from theory_checks.types import CheckResult, FittedConstant, Hypothesis, PowerLaw
from theory_checks.verdicts import rate_verdict

pytestmark = pytest.mark.usefixtures("single_thread")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _scaling_rows() -> list[dict]:
    """error = 3 / n exactly, and error = sigma^2 (a slope 2 the fake claims to be 3)."""
    rows = [{"variable": "n", "x": n, "repeat": r, "error": 3.0 / n * (1 + 0.01 * r)} for n in (2, 4, 8, 16) for r in range(3)]
    rows += [{"variable": "sigma", "x": s, "repeat": r, "error": s**2} for s in (0.5, 1.0, 2.0) for r in range(2)]
    return rows


SCALING_EXPONENTS = {
    "n": (PowerLaw(-1.02, -1.1, -0.95, 3.0, points=12), -1.0),
    "sigma": (PowerLaw(2.0, 1.9, 2.1, 1.0, points=6), 3.0),
}
RESULTS = {
    "exact-holds": CheckResult("exact-holds", "holds", instances=50, worst_slack=0.25, details={"ratio": math.inf}),
    "exact-fails": CheckResult(
        "exact-fails", "fails", instances=7, counterexample={"tau": 1.5, "eps": 0.25, "lhs": 2.0, "rhs": math.nan},
        evidence="a | pipe in the evidence",
    ),
    "false-found": CheckResult("false-found", "fails", instances=3, counterexample={"var_y": 0.5625, "var_z": 0.015625}),
    "false-holds": CheckResult("false-holds", "holds", instances=200, worst_slack=0.0),
    "corrected-holds": CheckResult("corrected-holds", "holds", instances=40, worst_slack=1e-3),
    "scaling": CheckResult(
        "scaling", "holds_with_constant", instances=18,
        constant=FittedConstant(2.5, "upper", 18, 4, (1.0, 2.5)),
        exponents=SCALING_EXPONENTS,
        details={"rows": _scaling_rows(), "notes": "the sigma sweep grows faster than claimed"},
        verdicts={name: rate_verdict(law, claimed) for name, (law, claimed) in SCALING_EXPONENTS.items()},
        hypotheses=(Hypothesis("Delta >~ sigma/delta_i", "delta Delta / sigma >= 1", 2.0, 1.0, True, "n = 2"),),
    ),
    "unmet": CheckResult(
        "unmet", "hypotheses_unmet", instances=5,
        exponents={"T": (PowerLaw(-0.1, -0.4, 0.1, 1.0, points=5), -0.5)},
        verdicts={"T": rate_verdict(PowerLaw(-0.1, -0.4, 0.1, 1.0), -0.5)},
        hypotheses=(Hypothesis("Assumption 9", "delta min gap / rho >= 1", 0.01, 1.0, False, "round 1"),),
        evidence="Assumption 9 unmet",
    ),
    "undecided": CheckResult("undecided", "inconclusive", instances=5),
    "corrected-fails": CheckResult("corrected-fails", "fails", counterexample={"x": 1}),
    "bound-fails": CheckResult("bound-fails", "fails", counterexample={"T": 10}),
}
KINDS = {
    "exact-holds": "exact", "exact-fails": "exact", "false-found": "false_as_printed",
    "false-holds": "false_as_printed", "corrected-holds": "corrected", "scaling": "up_to_constant",
    "corrected-fails": "corrected", "bound-fails": "up_to_constant", "unmet": "up_to_constant",
    "undecided": "up_to_constant",
}
CONTRADICTING = {"exact-fails", "false-holds", "corrected-fails"}
MAIN_SET = ["exact-holds", "exact-fails", "false-found", "false-holds", "corrected-holds", "scaling", "unmet",
            "undecided"]
PROVENANCE = "an algebra slip in A.9"


def fake_registry(names: list[str], budgets: list[str] | None = None,
                  by_seed: dict[int, dict[str, CheckResult]] | None = None) -> dict[str, Statement]:
    """Statements that return the canned results (recording the budget they got), or
    at a seed of ``by_seed``, its results."""

    def checker(name: str):
        def check(budget, seed):
            if budgets is not None:
                budgets.append(budget)
            return (by_seed or {}).get(seed, RESULTS)[name]

        return check

    return {name: Statement(name, f"Eq. ({i + 1})", f"claim of {name}", KINDS[name], checker(name),
                            PROVENANCE if KINDS[name] == "false_as_printed" else "")
            for i, name in enumerate(names)}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("theory")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "STATEMENTS", fake_registry(MAIN_SET))
        summary = write_report(out, budget="quick")
    return out, summary, (out / "theory_report.md").read_text()


def table_rows(text: str) -> dict[str, list[str]]:
    """The main table's rows by statement name, split on unescaped pipes."""
    table = text.split("## Scaling exponents")[0]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| statement"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0]] = cells
    return rows


def test_table_has_one_row_per_statement_with_seven_cells(report):
    _, _, text = report
    rows = table_rows(text)
    assert list(rows) == MAIN_SET  # registry order
    assert all(len(cells) == 7 for cells in rows.values())  # the pipe in an evidence line is escaped
    assert "a \\| pipe in the evidence" in text


def test_statuses_are_written_out(report):
    rows = table_rows(report[2])
    assert rows["exact-holds"][3] == "holds"
    assert rows["exact-fails"][3] == "FAILS"
    assert rows["scaling"][3] == "holds with constant C = 2.5"
    assert rows["scaling"][2] == "up_to_constant" and rows["scaling"][1] == "Eq. (6)"
    assert rows["unmet"][3] == "hypotheses unmet" and rows["unmet"][4] == "Assumption 9 unmet"
    assert rows["undecided"][3] == "inconclusive"


def test_legend_precedes_the_table_and_names_every_status_and_tolerance(report):
    head = report[2].split("| statement |")[0]
    for status in ("**holds**", "**holds with constant C**", "**holds, loose**", "**VACUOUS**", "**FAILS**",
                   "**inconclusive**", "**hypotheses unmet**"):
        assert status in head
    assert "**Negative controls.**" in head
    assert "1e-09" in head and "0.05" in head and "mean error over the repeats" in head


def test_evidence_names_instances_slack_constant_and_counterexample(report):
    rows = table_rows(report[2])
    assert "50 instances" in rows["exact-holds"][4] and "worst slack 0.25" in rows["exact-holds"][4]
    assert "upper constant 2.5 over 18 instances" in rows["scaling"][4]
    assert '"tau": 1.5' in rows["exact-fails"][4]


def test_exactly_the_contradictions_are_flagged(report):
    _, summary, text = report
    rows = table_rows(text)
    flagged = {name for name, cells in rows.items() if "CONTRADICTS KIND" in cells[6]}
    assert flagged == {"exact-fails", "false-holds"}
    assert set(summary["contradictions"]) == flagged


def test_exponent_section_gives_each_verdict_with_its_direction(report):
    section = report[2].split("## Scaling exponents")[1].split("## Hypotheses")[0]
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): [cell.strip() for cell in line.split("|")[1:-1]]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| statement")}
    # fitted 2.0 against a claimed growth of 3: error / bound ~ sigma^-1, the bound is loose there
    sigma = rows[("scaling", "sigma")]
    assert sigma[5] == "holds" and sigma[6].startswith("grows slower than claimed: the bound is loose")
    assert "x^-1.00 [-1.10, -0.90]" in sigma[6]
    assert rows[("scaling", "n")][5] == "holds" and rows[("scaling", "n")][6].startswith("as claimed")
    # a check whose hypotheses fail gives no verdict, but still the direction measured
    assert rows[("unmet", "T")][5] == "not given: hypotheses unmet"


def test_hypotheses_section_lists_each_measured_hypothesis(report):
    section = report[2].split("## Hypotheses")[1].split("## Counterexamples")[0]
    assert "- **scaling**: Delta >~ sigma/delta_i met" in section
    assert "- **unmet**: Assumption 9 unmet: delta min gap / rho >= 1; measured 0.01, needs 1 at round 1" in section


def test_false_statements_say_where_the_proof_goes_wrong(report):
    section = report[2].split("## Counterexamples")[1]
    found = section.split("### false-found")[1].split("###")[0]
    assert f"Where the proof goes wrong: {PROVENANCE}" in found
    assert "Where the proof goes wrong" not in section.split("### exact-fails")[1].split("###")[0]


def test_a_false_statement_needs_its_provenance():
    with pytest.raises(ValueError, match="provenance"):
        registry.register("no-provenance", "Eq. (1)", "claim", "false_as_printed")


def test_counterexamples_section_lists_each_failing_statement(report):
    section = report[2].split("## Counterexamples")[1]
    headings = re.findall(r"^### (\S+)", section, flags=re.M)
    assert headings == ["exact-fails", "false-found"]
    assert "- `var_z`: `0.015625`" in section and '- `rhs`: `"nan"`' in section


def test_findings_section_holds_each_checks_notes(report):
    findings = report[2].split("## Findings")[1].split("## Figures")[0]
    assert findings.strip().splitlines() == ["- **scaling**: the sigma sweep grows faster than claimed"]


def test_scaling_figure_is_a_png_listed_in_the_report(report):
    out, summary, text = report
    assert sorted(p.name for p in out.glob("*.png")) == ["scaling.png"]  # only the result with rows
    assert (out / "scaling.png").read_bytes()[:8] == PNG_MAGIC
    assert "[scaling.png](scaling.png)" in text
    assert summary["paths"]["figures"] == {"scaling": str(out / "scaling.png")}


def test_no_temporary_files_are_left(report):
    out = report[0]
    assert sorted(p.name for p in out.iterdir()) == ["scaling.png", "theory_report.json", "theory_report.md"]


def test_json_is_strict_and_keeps_every_result(report):
    out, summary, _ = report

    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    data = json.loads((out / "theory_report.json").read_text(), parse_constant=refuse)
    assert data["order"] == MAIN_SET and set(data["statements"]) == set(MAIN_SET)
    assert data["statements"]["exact-holds"]["result"]["details"]["ratio"] == "inf"
    law = data["statements"]["scaling"]["result"]["exponents"]["sigma"]
    assert law[0]["exponent"] == 2.0 and law[1] == 3.0
    assert data["statements"]["false-holds"]["contradicts_kind"] is True
    assert summary["statuses"]["scaling"] == "holds_with_constant"
    assert summary["seconds"] >= 0


def test_title_names_budget_and_time(report):
    first = report[2].splitlines()[0]
    assert re.fullmatch(r"# Theory checks: Werner et al\., its workshop version, CGPFL and FedSPD \(budget quick, \d+\.\d s\)", first)


def test_names_select_the_checks_that_run(tmp_path, monkeypatch):
    budgets: list[str] = []
    monkeypatch.setattr(registry, "STATEMENTS", fake_registry(["exact-holds", "false-found"], budgets))
    summary = write_report(tmp_path, budget="full", names=["false-found"])
    assert list(summary["statuses"]) == ["false-found"] and budgets == ["full"]


@pytest.mark.parametrize(
    "names, expected",
    [
        (["exact-holds", "false-found", "corrected-holds", "bound-fails"], 0),
        (["exact-holds", "exact-fails"], 1),
        (["false-found", "false-holds"], 1),
        (["corrected-holds", "corrected-fails"], 1),
    ],
)
def test_cli_exit_status_follows_the_kinds(tmp_path, monkeypatch, capsys, names, expected):
    budgets: list[str] = []
    monkeypatch.setattr(registry, "STATEMENTS", fake_registry(names, budgets))
    code = cli.main(["theory", "report", "--quick", "--out", str(tmp_path)])
    assert code == expected
    assert budgets == ["quick"] * len(names)
    printed = capsys.readouterr().out
    for name in names:
        line = next(line for line in printed.splitlines() if line.split()[:1] == [name])
        assert RESULTS[name].status in line
        assert ("contradicts" in line) == (name in CONTRADICTING)
    assert str(tmp_path / "theory_report.md") in printed


def test_cli_default_budget_is_full(tmp_path, monkeypatch):
    budgets: list[str] = []
    monkeypatch.setattr(registry, "STATEMENTS", fake_registry(["exact-holds"], budgets))
    assert cli.main(["theory", "report", "--out", str(tmp_path)]) == 0
    assert budgets == ["full"]


@pytest.mark.parametrize("kind", ["exact", "corrected", "false_as_printed", "up_to_constant"])
@pytest.mark.parametrize("status", ["holds", "holds_with_constant", "fails", "inconclusive", "hypotheses_unmet"])
def test_contradiction_rule(kind, status):
    promised_true = kind in ("exact", "corrected")
    expected = (promised_true and status == "fails") or (kind == "false_as_printed" and status != "fails")
    assert contradicts_kind(kind, CheckResult("s", status)) == expected


@settings(deadline=None, max_examples=100)
@given(
    st.floats(-3, 3), st.floats(-3, 3), st.floats(0.1, 10),
    st.lists(st.integers(1, 1000), min_size=2, max_size=6, unique=True),
)
def test_claimed_line_has_the_claimed_slope_and_meets_the_fit_at_the_geometric_mean(exponent, claimed, prefactor, xs):
    from theory_checks.report_figures import anchored_lines

    xs = np.array(sorted(xs)) / 10.0  # distinct x, so log-log slopes are well defined
    law = PowerLaw(exponent, exponent - 0.1, exponent + 0.1, prefactor)
    fitted, line = anchored_lines(law, claimed, xs)
    assert np.allclose(fitted, prefactor * xs**exponent)
    slopes = np.diff(np.log(line)) / np.diff(np.log(xs))
    assert np.allclose(slopes, claimed)
    centre = np.exp(np.log(xs).mean())
    # both lines are straight in log-log, so they agree at x = centre
    at_centre_fit = np.interp(np.log(centre), np.log(xs), np.log(fitted))
    at_centre_line = np.interp(np.log(centre), np.log(xs), np.log(line))
    assert at_centre_fit == pytest.approx(at_centre_line, abs=1e-9)


def test_seeds_add_every_seeds_status_and_flag_disagreement(tmp_path, monkeypatch):
    """Seed 0 writes the report; every seed's status is listed, and a statement whose
    status differs between seeds is marked; a contradiction at any seed counts."""
    flipped = {**RESULTS, "scaling": CheckResult("scaling", "inconclusive"),
               "false-found": CheckResult("false-found", "holds")}
    monkeypatch.setattr(registry, "STATEMENTS", fake_registry(["exact-holds", "scaling", "false-found"],
                                                              by_seed={1: flipped}))
    summary = write_report(tmp_path, budget="quick", seeds=2)
    text = (tmp_path / "theory_report.md").read_text()
    section = text.split("## Across seeds")[1].split("##")[0]
    assert "| exact-holds | holds | holds | yes |" in section
    assert "| scaling | holds with constant C = 2.5 | inconclusive | **no** |" in section
    assert summary["seeds"] == {0: {"exact-holds": "holds", "scaling": "holds_with_constant", "false-found": "fails"},
                                1: {"exact-holds": "holds", "scaling": "inconclusive", "false-found": "holds"}}
    assert summary["contradictions"] == ["false-found"]  # not found false at seed 1
    assert table_rows(text)["scaling"][3] == "holds with constant C = 2.5"  # the table is seed 0's


def test_cli_only_and_seeds(tmp_path, monkeypatch, capsys):
    budgets: list[str] = []
    monkeypatch.setattr(registry, "STATEMENTS", fake_registry(["exact-holds", "scaling"], budgets))
    assert cli.main(["theory", "report", "--quick", "--only", "scaling", "--seeds", "3", "--out", str(tmp_path)]) == 0
    assert budgets == ["quick"] * 3
    assert "| scaling | holds with constant C = 2.5 | holds with constant C = 2.5 | holds with constant C = 2.5 | yes |" \
        in (tmp_path / "theory_report.md").read_text()
    assert cli.main(["theory", "report", "--only", "nosuch", "--out", str(tmp_path)]) == 2
    assert "unknown statements ['nosuch']; registered: ['exact-holds', 'scaling']" in capsys.readouterr().err
    assert cli.main(["theory", "report", "--seeds", "0", "--out", str(tmp_path)]) == 2


def test_the_control_cell_shows_the_control_beside_the_real_run_and_its_verdict():
    from theory_checks.report import control_text, status_text
    from theory_checks.types import CheckResult, NegativeControl

    control = NegativeControl("a frozen model", 12.5, True, "error / bound at the largest T", real=0.9)
    assert control_text(CheckResult("x", "holds", negative_control=control)) == (
        "a frozen model: error / bound at the largest T 12.5 (real run: 0.9); violated")
    quiet = NegativeControl("a frozen model", 0.4, False, "error / bound at the largest T")
    assert control_text(CheckResult("x", "vacuous", negative_control=quiet)).endswith("; NOT violated")
    assert control_text(CheckResult("x", "fails")) == "-"
    assert status_text(CheckResult("x", "vacuous")) == "VACUOUS"
    assert status_text(CheckResult("x", "loose")) == "holds, loose"


def test_jobs_run_checks_in_worker_processes_with_the_same_results(tmp_path):
    """``--jobs 2`` runs each check in a fresh worker process: every result, to the last
    digit, equals the in-process run's (a check derives its streams from its seed), the
    order stays the registry's, and each check's seconds are reported."""
    names = ["descent", "lemma7", "var-y-le-var-z", "one-step-move"]
    reports = {}
    for jobs in (1, 2):
        args = ["theory", "report", "--quick", "--only", *names, "--seeds", "2", "--jobs", str(jobs), "--quiet",
                "--out", str(tmp_path / str(jobs))]
        assert cli.main(args) == 0
        reports[jobs] = json.loads((tmp_path / str(jobs) / "theory_report.json").read_text())
    assert reports[1]["order"] == reports[2]["order"] == names
    assert reports[2]["statements"] == reports[1]["statements"]
    assert reports[2]["seeds"] == reports[1]["seeds"]
    assert sorted(reports[2]["check_seconds"]["1"]) == sorted(names)
    assert all(seconds >= 0 for seconds in reports[2]["check_seconds"]["0"].values())
    assert "## Time" in (tmp_path / "2" / "theory_report.md").read_text()
    assert cli.main(["theory", "report", "--only", *names, "--jobs", "0", "--out", str(tmp_path)]) == 2
