"""The theory report: run the registered statement checks (Werner et al., Sec. 3 and
App. A; its workshop version; CGPFL; FedSPD) and write ``theory_report.md``, ``theory_report.json`` and one scaling figure
per statement that measured a scaling law.

A status contradicts a statement's kind when an ``exact`` or ``corrected`` statement
fails, or a ``false_as_printed`` one is not found false; :func:`contradicts_kind` is
the rule, and the CLI exits 1 on any contradiction.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from robust_pfl.engine.progress import progress_bar
from robust_pfl.engine.results import atomic_write_text, write_summary
from theory_checks.controls import LOOSE_FACTOR
from theory_checks.fitting import LEVEL
from theory_checks.report_figures import plot_scaling
from theory_checks.statements import registry
from theory_checks.statements.registry import Budget, Kind, Statement
from theory_checks.statements.search import TOLERANCE
from theory_checks.types import CheckResult
from theory_checks.verdicts import EXPONENT_TOLERANCE

REPORT_NAME = "theory_report.md"
JSON_NAME = "theory_report.json"
COUNTEREXAMPLE_INLINE = 100  # characters of a counterexample shown in the table


def contradicts_kind(kind: Kind, result: CheckResult) -> bool:
    """Whether the check's status contradicts what the kind promises."""
    if kind in ("exact", "corrected"):
        return result.status == "fails"
    if kind == "false_as_printed":
        return result.status != "fails"
    return False


def contradiction_note(kind: Kind, result: CheckResult) -> str:
    """The table's flag: empty, or what the contradiction is."""
    if not contradicts_kind(kind, result):
        return ""
    if kind == "false_as_printed":
        return "CONTRADICTS KIND: false as printed, but no counterexample found"
    return f"CONTRADICTS KIND: {kind} statement fails"


STATUS_TEXT = {"holds": "holds", "fails": "FAILS", "inconclusive": "inconclusive",
               "hypotheses_unmet": "hypotheses unmet", "vacuous": "VACUOUS", "loose": "holds, loose"}


def status_text(result: CheckResult) -> str:
    """``holds`` / ``holds with constant C = ...`` / ``holds, loose`` / ``VACUOUS`` /
    ``FAILS`` / ``inconclusive`` / ``hypotheses unmet`` (a failed or undecided rate has
    no constant)."""
    if result.status == "holds_with_constant":
        return "holds with constant" + ("" if result.constant is None else f" C = {result.constant.value:.3g}")
    return STATUS_TEXT[result.status]


def control_text(result: CheckResult) -> str:
    """The table's control cell: what was broken, its statistic beside the real run's,
    and whether it violated the claim (``-`` when the check ran none)."""
    control = result.negative_control
    parts = []
    if control is not None:
        real = "" if control.real is None else f" (real run: {control.real:.3g})"
        verdict = "violated" if control.violated else "NOT violated"
        parts.append(f"{control.description}: {control.statistic} {control.ratio:.3g}{real}; {verdict}")
    parts += [f"{found.description}: {found.ratio:.3g}, {'violated' if found.violated else 'NOT violated'}"
              for found in result.clustering_controls]
    return "; ".join(parts) if parts else "-"


def legend() -> list[str]:
    """What every status means, and the tolerances behind them (the report's head)."""
    return [
        "**How to read this report.** A status is what the checks found on the instances they ran, not a proof.",
        "",
        f"- **holds**: an `exact` or `corrected` statement that no instance tried violated by more than a relative "
        f"margin of {TOLERANCE:g} (margins of a few 1e-15 below 0 are rounding), and whose negative control "
        "violated it.",
        "- **holds with constant C**: a rate (`up_to_constant`) whose hypotheses hold on the instances run and "
        f"whose every fitted exponent meets the claim, within {EXPONENT_TOLERANCE:g} or faster, and whose negative "
        "control violated it; `C` is the smallest constant over those instances (finite data always admit one: "
        "the exponents decide).",
        f"- **holds, loose**: holds, but the bound (constant 1) is over {LOOSE_FACTOR:g}x the error at every point "
        "measured: true there, and uninformative.",
        "- **VACUOUS**: no violation found, but the negative control was not found violating either: the bound "
        "does not tell the algorithm from a broken one on these instances, so the check is no evidence.",
        "- **FAILS**: an exact statement violated; a `false_as_printed` statement's counterexample found; or a "
        "rate whose error / bound ratio grows without limit along a family meeting every hypothesis (the family "
        "is under Counterexamples).",
        "- **inconclusive**: a rate whose exponent interval holds both the claimed decay and no decay.",
        "- **hypotheses unmet**: the theorem's hypotheses fail on the instances run (which, and the measured "
        "values, are under Hypotheses), so they decide nothing about it.",
        "",
        "**Negative controls.** Every check that can hold runs, on the same instances, a broken algorithm (no "
        "clustering, a frozen model, a step that ignores the threshold) or a violated hypothesis, chosen so that a "
        "true statement must be violated by it, and judges it by the check's own rule; the table shows its "
        "statistic beside the real run's. A statement about a clustering algorithm run on the separated family "
        "also runs the algorithm without its clustering (no clustering, a wrong fixed partition, a random "
        "assignment each round): each must violate the bound, or the status is VACUOUS. A rate's claimed exponent "
        "is that of its bound's slowest-decaying term, the one it behaves as for large values of the swept "
        "variable; where the bound is kept as a formula it is read from the formula itself, and the instance's "
        "constants are swept beside the variable, the error's exponent along each judged against the formula's "
        "by the same rule (one hidden constant for every admissible instance).",
        "",
        f"Exponents are fitted to the mean error over the repeats (the expectation the rates bound) with a "
        f"{LEVEL:.0%} bootstrap interval over the repeats (widened by Student's quantile for few repeats). "
        "Directions: *faster than claimed* (the bound is loose there) is no violation; *slower than claimed* "
        "along a variable that may grow without limit is one. Kinds: `exact`; `corrected` (our fix of a false "
        "statement); `false_as_printed` (the check must find a counterexample); `up_to_constant` (a rate with "
        "a hidden constant). `CONTRADICTS KIND` flags a status its kind rules out.",
    ]


def evidence_text(result: CheckResult) -> str:
    """One table cell: the check's own line when it wrote one (it states its instances,
    slack, exponents or constant), else those facts from the result's fields; then a
    failing check's counterexample, shortened (the full one has its own section)."""
    if result.evidence:
        parts = [result.evidence]
    else:
        parts = []
        if result.instances:
            parts.append(f"{result.instances} instances")
        if result.worst_slack is not None:
            parts.append(f"worst slack {result.worst_slack:.3g}")
        if result.constant is not None:
            constant = result.constant
            parts.append(
                f"{constant.kind} constant {constant.value:.3g} over {constant.instances} instances "
                f"(decisive: #{constant.decisive})"
            )
        parts += [f"{variable}: slope {law.exponent:.3g} [{law.low:.3g}, {law.high:.3g}] vs claimed {claimed:g}"
                  for variable, (law, claimed) in result.exponents.items()]
    if result.counterexample is not None:
        shown = json.dumps(jsonable(result.counterexample), sort_keys=True)
        if len(shown) > COUNTEREXAMPLE_INLINE:
            shown = shown[: COUNTEREXAMPLE_INLINE - 3] + "..."
        parts.append(f"counterexample {shown}")
    return "; ".join(parts)


def counterexample_lines(counterexample: dict[str, Any]) -> list[str]:
    """A counterexample as a bullet per field, each value as compact JSON."""
    plain = jsonable(counterexample)
    return [f"- `{key}`: `{json.dumps(plain[key], allow_nan=False)}`" for key in sorted(plain)]


def cell(text: str) -> str:
    """Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def render_report(
    results: dict[str, CheckResult],
    statements: dict[str, Statement],
    budget: Budget,
    seconds: float,
    figures: dict[str, str],
    across_seeds: dict[int, dict[str, CheckResult]] | None = None,
    check_seconds: dict[str, float] | None = None,
) -> str:
    """The Markdown report of seed 0's ``results``: the statement table, the scaling
    exponents, the measured hypotheses, the counterexamples, the checks' findings
    (``details["notes"]``) and the figures; with ``across_seeds`` (every seed's
    results), each statement's status at every seed; with ``check_seconds``, each
    seed-0 check's time."""
    lines = [
        f"# Theory checks: Werner et al., its workshop version, CGPFL and FedSPD (budget {budget}, {seconds:.1f} s)",
        "",
        *legend(),
        "",
        "| statement | source | kind | status | evidence | negative control | flag |",
        "|---|---|---|---|---|---|---|",
    ]
    if not results:
        lines = lines[:-2] + ["No statement is registered."]
    for name, result in results.items():
        statement = statements[name]
        lines.append(
            "| " + " | ".join(
                cell(text) for text in (
                    name, statement.source, statement.kind, status_text(result), evidence_text(result),
                    control_text(result), contradiction_note(statement.kind, result),
                )
            ) + " |"
        )
    lines += ["", "## Scaling exponents", ""]
    fits = [(name, variable, law, claimed, result) for name, result in results.items()
            for variable, (law, claimed) in result.exponents.items()]
    if fits:
        lines += [
            "| statement | variable | fitted exponent | interval | claimed | verdict | direction |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, variable, law, claimed, result in fits:
            interval = f"[{law.low:.3g}, {law.high:.3g}] ({law.level:.0%}, {law.points} levels)"
            verdict = result.verdicts.get(variable)
            word, direction = ("-", "-") if verdict is None else (verdict.verdict, verdict.direction)
            if result.status == "hypotheses_unmet":
                word = "not given: hypotheses unmet"
            lines.append("| " + " | ".join(cell(text) for text in (
                name, variable, f"{law.exponent:.3g}", interval, f"{claimed:g}", word, direction,
            )) + " |")
    else:
        lines.append("No statement fitted a scaling exponent.")
    measured = {name: result.hypotheses for name, result in results.items() if result.hypotheses}
    if measured:
        lines += ["", "## Hypotheses", "", "Measured on the instances each check ran.", ""]
        lines += [f"- **{name}**: " + "; ".join(hypothesis.describe() for hypothesis in hypotheses)
                  for name, hypotheses in measured.items()]
    if across_seeds and len(across_seeds) > 1:
        seeds = sorted(across_seeds)
        lines += ["", "## Across seeds", "", "The same checks on the instances of other seeds (the report above is "
                  "seed 0's).", "",
                  "| statement | " + " | ".join(f"seed {seed}" for seed in seeds) + " | agree |",
                  "|---|" + "---|" * (len(seeds) + 1)]
        for name in results:
            statuses = [status_text(across_seeds[seed][name]) for seed in seeds]
            agree = "yes" if len({across_seeds[seed][name].status for seed in seeds}) == 1 else "**no**"
            lines.append("| " + " | ".join(cell(text) for text in (name, *statuses, agree)) + " |")
    lines += ["", "## Counterexamples", ""]
    failing = {name: result for name, result in results.items() if result.status == "fails"}
    if not failing:
        lines.append("No statement failed.")
    for name, result in failing.items():
        lines += [f"### {name} ({statements[name].kind}: {statements[name].source})", "",
                  f"Claim: {statements[name].claim}", ""]
        if statements[name].provenance:
            lines += [f"Where the proof goes wrong: {statements[name].provenance}", ""]
        if result.counterexample is None:
            lines.append("(the check recorded no instance)")
        else:
            lines += counterexample_lines(result.counterexample)
        lines.append("")
    notes = {name: result.details.get("notes") for name, result in results.items() if result.details.get("notes")}
    if notes:
        lines += ["## Findings", ""]
        lines += [f"- **{name}**: {note}" for name, note in notes.items()]
        lines.append("")
    listed = {name: figure_paths(name, result, figures) for name, result in results.items()}
    if any(listed.values()):
        lines += ([] if lines[-1] == "" else [""]) + ["## Figures", ""]
        lines += [f"- {name}: " + ", ".join(f"[{Path(path).name}]({path})" for path in paths)
                  for name, paths in listed.items() if paths]
    if check_seconds:
        lines += ([] if lines[-1] == "" else [""]) + ["## Time", "",
                  "Seconds of each check (seed 0): " + "; ".join(
                      f"{name} {check_seconds[name]:.1f}" for name in results if name in check_seconds) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def figure_paths(name: str, result: CheckResult, figures: dict[str, str]) -> list[str]:
    """The report's scaling figure of ``name`` (if drawn), then the check's own."""
    own = [figures[name]] if name in figures else []
    return own + [path for path in result.figures if path not in own]


def jsonable(value: Any) -> Any:
    """Plain JSON types for a result (dataclasses, numpy, torch, paths), non-finite
    floats spelled ``"inf"``, ``"-inf"``, ``"nan"`` as
    :func:`robust_pfl.engine.results.write_summary` does."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy arrays and scalars, tensors
        return jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def _non_finite(value: float) -> str:
    """The spelling of :func:`robust_pfl.engine.results.write_summary` (strict JSON)."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


#: One check to run: the budget, the statement's name and the seed.
CheckTask = tuple[Budget, str, int]
#: What a runner gives back for a task: the result and the check's seconds.
CheckOutcome = tuple[CheckResult, float]
#: Runs ``function`` on every task, in any order and anywhere, yielding each task with
#: its outcome as it finishes (the command line passes
#: :func:`robust_pfl.backends.in_worker_processes` for ``--jobs N``).
Runner = Callable[[Callable[[CheckTask], CheckOutcome], Sequence[CheckTask]], Iterator[tuple[CheckTask, CheckOutcome]]]


def in_this_process(function: Callable[[CheckTask], CheckOutcome],
                    tasks: Sequence[CheckTask]) -> Iterator[tuple[CheckTask, CheckOutcome]]:
    """The default runner: every task in turn, in this process."""
    for task in tasks:
        yield task, function(task)


def _run_checks(budget: Budget, names: list[str] | None, seeds: int, runner: Runner = in_this_process
                ) -> tuple[dict[int, dict[str, CheckResult]], dict[int, dict[str, float]]]:
    """:func:`registry.run_checks` for seeds ``0 .. seeds - 1`` through ``runner`` (a
    check derives every stream from its seed, so the results do not depend on where or
    in which order the checks run), with progress: a bar on a terminal, else a line on
    stderr per finished check (``progress_bar``).  A runner in other processes imports
    the registry afresh there: a statement registered at run time rather than on import
    (in a notebook) is unknown to it.  Returns the results and each check's seconds,
    both by seed, then statement in registry order."""
    chosen = list(registry.STATEMENTS) if names is None else list(names)
    if any(name not in registry.STATEMENTS for name in chosen):
        registry.run_checks(budget, chosen, 0)  # raises, naming them, before any check runs
    tasks = [(budget, name, seed) for seed in range(seeds) for name in chosen]
    found: dict[tuple[str, int], CheckOutcome] = {}
    with progress_bar(len(tasks), f"theory report ({budget})") as bar:
        for (_, name, seed), (result, seconds) in runner(timed_check, tasks):
            found[name, seed] = result, seconds
            bar.item_done(f"{name} seed={seed}: {status_text(result)} ({seconds:.1f} s)", advance=1)
    across = {seed: {name: found[name, seed][0] for name in chosen} for seed in range(seeds)}
    seconds_by_seed = {seed: {name: found[name, seed][1] for name in chosen} for seed in range(seeds)}
    return across, seconds_by_seed


def timed_check(task: CheckTask) -> CheckOutcome:
    """One statement's check at one seed, and its seconds (a runner's function)."""
    budget, name, seed = task
    start = time.perf_counter()
    result = registry.run_checks(budget, [name], seed)[name]
    return result, time.perf_counter() - start


def write_report(out: Path, budget: Budget = "quick", names: list[str] | None = None,
                 seeds: int = 1, runner: Runner = in_this_process) -> dict[str, Any]:
    """Run the checks (``names``, default all) on the instances of seeds ``0 ..
    seeds - 1`` through ``runner`` and write the report (seed 0's, with every seed's statuses), its JSON
    and seed 0's scaling figures into ``out``.

    Returns ``{"budget", "seconds", "statuses": {name: status}, "kinds",
    "contradictions": [names], "seeds": {seed: {name: status}}, "paths": {"report",
    "json", "figures": {name: path}}}``; a statement contradicts its kind when it does
    at any seed.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    out = Path(out)
    started = time.perf_counter()
    across, check_seconds = _run_checks(budget, names, seeds, runner)
    results = across[0]
    seconds = time.perf_counter() - started
    statements = registry.STATEMENTS
    out.mkdir(parents=True, exist_ok=True)
    figures = {name: f"{name}.png" for name, result in results.items() if plot_scaling(result, out / f"{name}.png")}
    atomic_write_text(out / REPORT_NAME, render_report(results, statements, budget, seconds, figures, across,
                                                       check_seconds[0]))
    contradictions = [name for name in results
                      if any(contradicts_kind(statements[name].kind, across[seed][name]) for seed in across)]
    payload = {
        "budget": budget,
        "seconds": seconds,
        "check_seconds": {str(seed): by_name for seed, by_name in check_seconds.items()},
        "contradictions": contradictions,
        "seeds": {str(seed): {name: result.status for name, result in found.items()} for seed, found in across.items()},
        "order": list(results),  # registry order (the file's keys are sorted)
        "statements": {
            name: {
                "source": statements[name].source,
                "claim": statements[name].claim,
                "kind": statements[name].kind,
                "status": status_text(result),
                "contradicts_kind": name in contradictions,
                "figure": figures.get(name),
                "result": jsonable(result),
            }
            for name, result in results.items()
        },
    }
    write_summary(payload, out / JSON_NAME)
    return {
        "budget": budget,
        "seconds": seconds,
        "statuses": {name: result.status for name, result in results.items()},
        "kinds": {name: statements[name].kind for name in results},
        "contradictions": contradictions,
        "seeds": {seed: {name: result.status for name, result in found.items()} for seed, found in across.items()},
        "paths": {
            "report": str(out / REPORT_NAME),
            "json": str(out / JSON_NAME),
            "figures": {name: str(out / path) for name, path in figures.items()},
        },
    }
