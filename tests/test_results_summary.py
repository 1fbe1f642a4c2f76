"""``robust-pfl results``: the paper table of a grid store or a run (mean ± sd over
seeds, computed here independently from results.csv / history.csv), its comparison of
two stores, its formats; and what came with it: ``run`` refusing to write over an
earlier run, the ``provenance`` of summary.json, ``--version``, methods in config
order."""

from __future__ import annotations

import csv
import io
import json
import platform
import re
import socket
import subprocess
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import torch

import robust_pfl
from robust_pfl import experiments, provenance
from robust_pfl.cli import main
from robust_pfl.grid import run_grid
from robust_pfl.grid_file import expand_grid
from robust_pfl.engine.results import ResultTable, summary_text
from robust_pfl.summaries import compare_tables, load_finals, render, summary_table

pytestmark = pytest.mark.usefixtures("single_thread")

#: Config order that is not alphabetical (alphabetical: fc, global, median).
METHODS = [
    {"name": "global", "aggregator": "median", "label": "median", "lr": 0.01},
    {"name": "global", "lr": 0.01},
    {"name": "fc", "lr": 0.01},
]
ORDER = ["median", "global", "fc"]


def grid_data(**changes) -> dict:
    data = {
        "seeds": [0, 1],
        "rounds": 2,
        "eval_every": 1,
        "task": {"clusters": 2, "clients_per_cluster": 3},
        "methods": METHODS,
        # method.lr has one value: an axis that does not vary, so the table leaves it out
        "grid": {"attack": [{"name": "none"}, {"name": "large_gradient"}], "byzantine": {"total": [0, 2]},
                 "method": {"lr": [0.01]}},
    }
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A real grid store: 3 methods x 2 seeds x 2 attacks x 2 Byzantine counts."""
    out = tmp_path_factory.mktemp("store")
    robust_pfl.run_grid(grid_data(), out_dir=out, progress=False)
    return out


def expected_stats(results_csv: Path, metric: str, labels: list[str]) -> pd.DataFrame:
    """Mean and sd (ddof=1) over seeds of each cell's final ``metric``, straight from
    the store with pandas."""
    frame = pd.read_csv(results_csv)
    final = frame[(frame["status"] == "ok") & frame["final"] & (frame["metric"] == metric)]
    stats = final.groupby(labels)["value"].agg(["mean", "std", "count"]).reset_index()
    for column in labels:
        stats[column] = stats[column].astype(str)
    return stats


def markdown_rows(text: str) -> list[list[str]]:
    """The cells of each line of the first Markdown table in ``text`` (the rule too)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


# -- the table of a grid store -----------------------------------------------------------------
def test_store_table_has_a_row_per_method_attack_and_count_in_config_order(store):
    table = summary_table(store)
    labels = ["method", "attack", "byzantine.total"]
    # method.lr and seed are no columns: one does not vary, the other is averaged over
    assert list(table.columns) == [*labels, "param_error_mean", "param_error_sd", "param_error_n"]
    assert table.attrs["metrics"] == ["param_error"]  # no accuracy in the synthetic task: the fallback
    assert list(dict.fromkeys(table["method"])) == ORDER
    assert table[labels].values.tolist() == [
        [method, attack, count] for method in ORDER for attack in ("none", "large_gradient") for count in ("0", "2")
    ]
    expected = expected_stats(store / "results.csv", "param_error", labels)
    merged = table.merge(expected, on=labels, validate="one_to_one")
    assert len(merged) == len(table) == 12
    assert merged["param_error_mean"].tolist() == pytest.approx(merged["mean"].tolist(), rel=1e-12)
    assert merged["param_error_sd"].tolist() == pytest.approx(merged["std"].tolist(), rel=1e-12)
    assert (merged["param_error_n"] == 2).all() and (merged["count"] == 2).all()
    wide = summary_table(store, all_labels=True)
    assert "method.lr" in wide.columns and set(wide["method.lr"]) == {"0.01"}


def test_store_markdown_shows_mean_pm_sd_and_the_cli_prints_it(store, capsys):
    assert main(["results", str(store)]) == 0
    out = capsys.readouterr().out
    rows = markdown_rows(out)
    assert rows[0] == ["method", "attack", "byzantine.total", "param_error"]
    assert rows[1] == ["---", "---", "---", "---:"]
    expected = expected_stats(store / "results.csv", "param_error", ["method", "attack", "byzantine.total"])
    shown = {tuple(row[:3]): row[3] for row in rows[2:]}
    assert len(shown) == len(rows) - 2 == 12
    for _, row in expected.iterrows():
        mean, sd = row["mean"], row["std"]
        assert shown[(row["method"], row["attack"], row["byzantine.total"])] == f"{mean:.4g} ± {sd:.2g}"
    assert [row[0] for row in rows[2::4]] == ORDER
    assert "mean ± sd over 2 seeds" in out


def test_methods_keep_grid_order_whatever_order_the_cells_were_stored_in(store, tmp_path):
    """A parallel grid stores cells as they finish: the table's order is the grid's
    (grid.json), not the store's."""
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "grid.json").write_text((store / "grid.json").read_text())
    with open(store / "results.csv", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    blocks: dict[str, list] = {}
    for row in rows:
        blocks.setdefault(row[0], []).append(row)
    with open(copy / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for block in reversed(list(blocks.values())):
            writer.writerows(block)
    assert pd.read_csv(copy / "results.csv")["method"].iloc[0] == "fc"  # stored last method first
    pd.testing.assert_frame_equal(summary_table(copy), summary_table(store))


def fake_accuracy(shift: float = 0.0):
    """A cell's rows known in advance: test_accuracy at rounds 0 and 2, final
    ``0.5 + 0.1 * method index + 0.05 * attack index + 0.01 * seed + shift``."""

    def run(payload, source, **kwargs):
        method = payload["methods"][0].get("label") or payload["methods"][0]["name"]
        attack = payload["attack"]["name"]
        value = (0.5 + 0.1 * ORDER.index(method) + 0.05 * ["none", "large_gradient", "alie"].index(attack)
                 + 0.01 * payload["seeds"][0] + shift)
        return [{"round": 0, "metric": "test_accuracy", "value": 0.1},
                {"round": 2, "metric": "test_accuracy", "value": value},
                {"round": 2, "metric": "test_loss", "value": 1.0 - value}]

    return run


def fake_store(out: Path, monkeypatch, attacks: list[str], seeds: list[int], shift: float = 0.0) -> Path:
    monkeypatch.setattr(experiments, "run_cell_config", fake_accuracy(shift))
    data = grid_data(seeds=seeds, grid={"attack": [{"name": name} for name in attacks]})
    run_grid(expand_grid(data, "fake grid"), out, progress=False)
    return out


def test_accuracy_is_shown_in_percent_and_one_seed_as_n_1(tmp_path, monkeypatch):
    store = fake_store(tmp_path / "one", monkeypatch, ["none", "large_gradient"], seeds=[3])
    table = summary_table(store)
    assert table.attrs["percent"] == ["test_accuracy"]
    assert table["test_accuracy_sd"].isna().all() and (table["test_accuracy_n"] == 1).all()
    assert table["test_accuracy_mean"].iloc[0] == pytest.approx(0.53)  # the last round's, not round 0's
    rows = markdown_rows(render(table, "md"))
    assert rows[0] == ["method", "attack", "test_accuracy (%)"]
    assert rows[2] == ["median", "none", "53.0 (n=1)"]
    assert rows[3] == ["median", "large_gradient", "58.0 (n=1)"]
    assert [row[0] for row in rows[2::2]] == ORDER
    two = summary_table(fake_store(tmp_path / "two", monkeypatch, ["none"], seeds=[0, 1, 2]),
                        ["test_accuracy", "test_loss"])
    rows = markdown_rows(render(two, "md"))
    assert rows[0] == ["method", "attack", "test_accuracy (%)", "test_loss"]
    assert rows[3] == ["global", "none", "61.0 ± 1.0", "0.39 ± 0.01"]


def test_compare_gives_each_cells_difference_and_lists_cells_only_in_one(tmp_path, monkeypatch, capsys):
    this = fake_store(tmp_path / "this", monkeypatch, ["none", "large_gradient"], seeds=[0, 1])
    other = fake_store(tmp_path / "other", monkeypatch, ["none", "alie"], seeds=[0, 1, 2], shift=-0.02)
    table = compare_tables(this, other)
    assert list(table[["method", "attack", "present"]].itertuples(index=False, name=None)) == [
        *[(m, a, "both" if a == "none" else "this only") for m in ORDER for a in ("none", "large_gradient")],
        *[(m, "alie", "other only") for m in ORDER],
    ]
    # independently: the means of each store's results.csv, subtracted
    means = [expected_stats(path / "results.csv", "test_accuracy", ["method", "attack"]).set_index(["method", "attack"])
             for path in (this, other)]
    both = table[table["present"] == "both"].set_index(["method", "attack"])
    for key, row in both.iterrows():
        assert row["test_accuracy_mean"] == pytest.approx(means[0].loc[key, "mean"])
        assert row["test_accuracy_other_mean"] == pytest.approx(means[1].loc[key, "mean"])
        assert row["test_accuracy_diff"] == pytest.approx(means[0].loc[key, "mean"] - means[1].loc[key, "mean"])
        assert row["test_accuracy_diff"] == pytest.approx(0.02 - 0.005)  # shift, and seeds 0-1 vs 0-2
        assert (row["test_accuracy_n"], row["test_accuracy_other_n"]) == (2, 3)
    assert table.loc[table["present"] != "both", "test_accuracy_diff"].isna().all()

    assert main(["results", str(this), "--compare", str(other)]) == 0
    out = capsys.readouterr().out
    rows = markdown_rows(out)
    assert rows[0] == ["method", "attack", "test_accuracy (%)", "test_accuracy (%) other",
                       "Δ test_accuracy (%)", "only in"]
    assert rows[2] == ["median", "none", "50.5 ± 0.7", "49.0 ± 1.0", "+1.5", ""]
    assert rows[3] == ["median", "large_gradient", "55.5 ± 0.7", "–", "–", "this"]
    assert rows[-1] == ["fc", "alie", "–", "79.0 ± 1.0", "–", "other"]  # 0.5 + 0.2 + 0.1 + 0.01 - 0.02
    assert f"this: {this}; other: {other}" in out


def test_compare_of_two_runs_matches_by_method_and_attack(tmp_path):
    outs = []
    for name, seeds in (("a", [0, 1]), ("b", [0])):
        config = write_run_config(tmp_path / f"{name}.toml", seeds=seeds)
        assert main(["run", str(config), "--out", str(tmp_path / name)]) == 0
        outs.append(tmp_path / name)
    table = compare_tables(*outs, metrics=["test_loss"])
    assert (table["present"] == "both").all() and table["method"].tolist() == RUN_ORDER
    history = [pd.read_csv(out / "history.csv") for out in outs]
    for _, row in table.iterrows():
        finals = [h[(h["method"] == row["method"]) & (h["metric"] == "test_loss") & (h["round"] == 3)]["value"]
                  for h in history]
        assert row["test_loss_diff"] == pytest.approx(finals[0].mean() - finals[1].mean(), rel=1e-12)


def test_compare_across_the_attack_pairs_two_stores_method_by_method(tmp_path, monkeypatch, capsys):
    """Two stores that differ only in their attack share no row when every label must
    match; ``--across attack`` (or ``--match method``) pairs them method by method,
    each side's attack shown, the difference the fake's attack term (0.05 x 0 - 0.05 x 2)."""
    this = fake_store(tmp_path / "none", monkeypatch, ["none"], seeds=[0, 1])
    other = fake_store(tmp_path / "alie", monkeypatch, ["alie"], seeds=[0, 1])
    assert (compare_tables(this, other)["present"] != "both").all()  # the default: attacks cannot meet

    across = compare_tables(this, other, across=["attack"])
    assert list(across[["method", "attack", "attack_other", "present"]].itertuples(index=False, name=None)) == [
        (m, "none", "alie", "both") for m in ORDER]
    assert across["test_accuracy_diff"].tolist() == pytest.approx([-0.10] * 3)
    assert (across["test_accuracy_n"] == 2).all() and (across["test_accuracy_other_n"] == 2).all()
    pd.testing.assert_frame_equal(compare_tables(this, other, match=["method"]), across)

    assert main(["results", str(this), "--compare", str(other), "--across", "attack"]) == 0
    rows = markdown_rows(capsys.readouterr().out)
    assert rows[0] == ["method", "attack", "attack other", "test_accuracy (%)", "test_accuracy (%) other",
                       "Δ test_accuracy (%)"]
    assert rows[2] == ["median", "none", "alie", "50.5 ± 0.7", "60.5 ± 0.7", "-10.0"]

    per_seed = compare_tables(this, other, match=["method", "seed"])  # seed matched: a row per seed, not averaged
    assert list(per_seed[["method", "seed"]].itertuples(index=False, name=None)) == [
        (m, s) for m in ORDER for s in ("0", "1")]
    assert (per_seed["test_accuracy_n"] == 1).all() and per_seed["test_accuracy_diff"].tolist() == pytest.approx(
        [-0.10] * 6)


def test_compare_refuses_unknown_labels_and_matching_without_compare(tmp_path, monkeypatch, capsys):
    this = fake_store(tmp_path / "s", monkeypatch, ["none"], seeds=[0])
    assert main(["results", str(this), "--compare", str(this), "--across", "defence"]) == 2
    assert "--across defence: not a label" in capsys.readouterr().err
    assert main(["results", str(this), "--match", "method"]) == 2
    assert "give --compare" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one or the other
        main(["results", str(this), "--compare", str(this), "--match", "method", "--across", "attack"])


def test_latex_is_a_booktabs_tabular_and_csv_reads_back(tmp_path, monkeypatch, capsys):
    store = fake_store(tmp_path / "s", monkeypatch, ["none", "large_gradient"], seeds=[0, 1])
    assert main(["results", str(store), "--format", "latex", "--metric", "test_accuracy", "test_loss"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == r"\begin{tabular}{llrr}"
    assert lines[1:3] == [r"\toprule", r"method & attack & test\_accuracy (\%) & test\_loss \\"]
    assert lines[3] == r"\midrule"
    end = lines.index(r"\end{tabular}")
    assert lines[end - 1] == r"\bottomrule"
    body = lines[4:end - 1]
    assert len(body) == 6
    assert all(line.endswith(r" \\") and line.count(" & ") == 3 for line in body)
    assert body[0] == r"median & none & 50.5 $\pm$ 0.7 & 0.495 $\pm$ 0.0071 \\"
    assert body[1].startswith(r"median & large\_gradient & ")
    assert all(line.startswith("%") for line in lines[end + 1:])

    assert main(["results", str(store), "--format", "csv", "--metric", "test_accuracy", "test_loss"]) == 0
    read = pd.read_csv(io.StringIO(capsys.readouterr().out))
    expected = summary_table(store, ["test_accuracy", "test_loss"])
    pd.testing.assert_frame_equal(read.astype({"method": str, "attack": str}), expected, check_dtype=False)

    assert main(["results", str(store), "--compare", str(store), "--format", "csv"]) == 0
    read = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert (read["present"] == "both").all() and (read["test_accuracy_diff"] == 0).all()


# -- a run's output directory ------------------------------------------------------------------
RUN_CONFIG = """\
    seeds = {seeds}
    rounds = 3
    eval_every = 2
    batch_size = 16
    [task]
    name = "image"
    dataset = "digits"
    kind = "private_label"
    clusters = 2
    clients_per_cluster = 2
    model = {{ name = "mlp", hidden = [8] }}
    [byzantine]
    total = 1
    [attack]
    name = "large_gradient"
    [[methods]]
    name = "local"
    lr = 0.1
    [[methods]]
    name = "global"
    label = "fedavg"
    lr = 0.1
    [[methods]]
    name = "fc"
    lr = 0.1
"""
RUN_ORDER = ["local", "fedavg", "fc"]  # alphabetical: fc, fedavg, local


def write_run_config(path: Path, seeds=(0, 1)) -> Path:
    path.write_text(textwrap.dedent(RUN_CONFIG.format(seeds=list(seeds))))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> tuple[Path, str]:
    """A run of three methods on the digits, and what ``robust-pfl run`` printed."""
    folder = tmp_path_factory.mktemp("run")
    config = write_run_config(folder / "run.toml")
    out = folder / "out"
    buffer = io.StringIO()
    from contextlib import redirect_stdout

    with redirect_stdout(buffer):
        assert main(["--threads", "1", "run", str(config), "--out", str(out)]) == 0
    return out, buffer.getvalue()


def test_run_table_averages_each_seeds_last_round_in_percent(run_dir):
    out, _ = run_dir
    table = summary_table(out)
    assert list(table.columns) == ["method", "attack", "test_accuracy_mean", "test_accuracy_sd", "test_accuracy_n"]
    assert table["method"].tolist() == RUN_ORDER and set(table["attack"]) == {"large_gradient"}
    history = pd.read_csv(out / "history.csv")
    last = history[(history["round"] == 3) & (history["metric"] == "test_accuracy")]
    expected = last.groupby("method")["value"].agg(["mean", "std"])
    for _, row in table.iterrows():
        assert row["test_accuracy_mean"] == pytest.approx(expected.loc[row["method"], "mean"], rel=1e-12)
        assert row["test_accuracy_sd"] == pytest.approx(expected.loc[row["method"], "std"], rel=1e-12)
    rows = markdown_rows(render(table))
    assert rows[0][-1] == "test_accuracy (%)"
    mean, sd = expected.loc["fedavg", "mean"], expected.loc["fedavg", "std"]
    assert rows[3] == ["fedavg", "large_gradient", f"{100 * mean:.1f} ± {100 * sd:.1f}"]
    assert set(load_finals(out).frame["seed"]) == {"0", "1"}


# -- config order ------------------------------------------------------------------------------
def test_run_prints_and_stores_methods_in_config_order(run_dir):
    out, printed = run_dir
    shown = [line.split(":")[0].strip() for line in printed.splitlines()[1:]]
    assert shown == RUN_ORDER
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["final"]) == RUN_ORDER
    # the other keys stay sorted, as before
    assert list(summary) == sorted(summary)
    assert all(list(metrics) == sorted(metrics) for metrics in summary["final"].values())


def test_result_table_final_keeps_the_order_rows_came_in():
    table = ResultTable()
    for seed in (0, 1):
        for method in ("zeta", "alpha", "mid"):
            table.add(method, seed, 1, {"b": 1.0, "a": 2.0})
    final = table.final()
    assert list(final) == ["zeta", "alpha", "mid"]
    text = summary_text({"z": 1, "final": final, "a": {"y": 1, "x": 2}})
    assert list(json.loads(text)) == ["a", "final", "z"]
    assert list(json.loads(text)["final"]) == ["zeta", "alpha", "mid"]
    assert list(json.loads(text)["a"]) == ["x", "y"]


# -- run refuses an earlier run's directory ------------------------------------------------------
SMALL = """\
    seeds = [0]
    rounds = 2
    {every}
    [task]
    clusters = 2
    clients_per_cluster = 2
    [[methods]]
    name = "local"
    lr = 0.01
"""


def test_run_into_an_earlier_runs_directory_exits_2_unless_overwrite(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(textwrap.dedent(SMALL.format(every="")))
    out = tmp_path / "out"
    out.mkdir()  # an empty directory is fine
    assert main(["run", str(config), "--out", str(out)]) == 0
    capsys.readouterr()
    before = (out / "summary.json").read_text()
    assert main(["run", str(config), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = captured.err
    assert error.startswith("error: ") and str(out) in error and "--resume" in error and "--overwrite" in error
    assert "Traceback" not in error
    assert (out / "summary.json").read_text() == before  # untouched
    assert main(["run", str(config), "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["provenance"] != json.loads(before)["provenance"]
    assert main(["run", str(config), "--out", str(out), "--overwrite", "--resume"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_run_refuses_a_directory_holding_only_checkpoints_but_resumes_it(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(textwrap.dedent(SMALL.format(every="checkpoint_every = 1")))
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    (out / "summary.json").unlink()
    (out / "history.csv").unlink()  # as a kill before the outputs were written leaves it
    assert main(["run", str(config), "--out", str(out)]) == 2
    assert "checkpoints" in capsys.readouterr().err
    assert main(["run", str(config), "--out", str(out), "--resume"]) == 0
    assert (out / "summary.json").exists()


# -- provenance and --version ------------------------------------------------------------------
PROVENANCE_KEYS = {"version", "git_commit", "torch", "device", "device_name", "torch_threads", "wall_seconds",
                   "host", "machine", "python", "finished_utc"}


def head_commit() -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(Path(robust_pfl.__file__).parent), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def test_run_summary_records_its_provenance_and_keeps_its_keys(run_dir):
    out, _ = run_dir
    summary = json.loads((out / "summary.json").read_text())
    assert {"config", "final", "provenance"} <= set(summary)
    record = summary["provenance"]
    assert set(record) == PROVENANCE_KEYS
    assert record["torch"] == torch.__version__ and record["version"] == robust_pfl.__version__
    assert record["device"] == "cpu" and record["device_name"] is None and record["torch_threads"] == 1
    assert record["python"] == platform.python_version() and record["host"] == socket.gethostname()
    assert 0 < record["wall_seconds"] < 600
    finished = datetime.fromisoformat(record["finished_utc"])
    assert finished.utcoffset() == timedelta(0) and datetime.now(UTC) - finished < timedelta(hours=1)
    commit = head_commit()
    if commit is not None and (Path(robust_pfl.__file__).parent.parent / ".git").exists():
        assert record["git_commit"] == commit
    else:
        assert record["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", record["git_commit"])


def test_grid_summary_records_its_provenance(store):
    summary = json.loads((store / "summary.json").read_text())
    assert {"cells", "ran", "errors", "seconds"} <= set(summary)
    record = summary["provenance"]
    assert set(record) == PROVENANCE_KEYS
    assert record["torch"] == torch.__version__ and record["device"] == "cpu" and record["torch_threads"] == 1
    assert record["wall_seconds"] == summary["seconds"]


def test_git_commit_is_none_without_git_or_outside_a_checkout(tmp_path, monkeypatch):
    provenance.git_commit.cache_clear()
    try:
        assert provenance.git_commit(tmp_path) is None  # no checkout there

        def absent(*args, **kwargs):
            raise FileNotFoundError("git")

        monkeypatch.setattr(subprocess, "run", absent)
        assert provenance.git_commit(provenance.PACKAGE_DIR) is None

        def slow(*args, **kwargs):
            raise subprocess.TimeoutExpired(args[0], kwargs.get("timeout"))

        provenance.git_commit.cache_clear()
        monkeypatch.setattr(subprocess, "run", slow)
        assert provenance.git_commit(provenance.PACKAGE_DIR) is None
        assert provenance.version_text() == f"robust-pfl {robust_pfl.__version__}"
    finally:
        provenance.git_commit.cache_clear()


def test_version_prints_the_package_version_and_commit(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.strip()
    commit = provenance.git_commit()
    assert out == f"robust-pfl {robust_pfl.__version__}" + (f" (commit {commit})" if commit else "")


# -- bad input ---------------------------------------------------------------------------------
def test_missing_or_malformed_directories_exit_2_naming_them(tmp_path, capsys, store):
    def error_of(*args: str) -> str:
        assert main(["results", *args]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
        return captured.err

    assert "no such directory" in error_of(str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    assert "neither a grid store" in error_of(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.csv").write_text("a,b\n1,2\n")
    assert "not a grid results store" in error_of(str(bad))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "history.csv").write_text("method,seed,round,metric,value\nfc,0,1,x,1.0\n")
    assert "did not finish" in error_of(str(unfinished))
    (unfinished / "summary.json").write_text("{not json")
    assert "summary.json" in error_of(str(unfinished))
    (unfinished / "summary.json").write_text("{}")
    (unfinished / "history.csv").write_text("method,seed,round,metric,value\nfc,0,one,x,1.0\n")
    assert "'round'" in error_of(str(unfinished))
    message = error_of(str(store), "--metric", "test_acuracy")
    assert "test_acuracy" in message and "param_error" in message
    assert "no such directory" in error_of(str(store), "--compare", str(tmp_path / "absent"))
