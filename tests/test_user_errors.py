"""What a user sees when something is wrong: one-line or per-field errors with the
config's name, the allowed values and a "did you mean", exit status 2, never a
traceback; listings and ``--help`` without internals or reST markup; quick modes that
say what they do not check."""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robust_pfl import cli
from robust_pfl.config import ConfigError, load_config
from robust_pfl.engine.datasets import DatasetError
from robust_pfl.engine.datasets.idx import IDX_FILES, parse_idx
from robust_pfl.experiments import validate
from robust_pfl.engine.placement import ByzantinePlacement
from robust_pfl.engine.tasks.images import ImageTask

from test_config import METHOD, QUICKSTART, write  # the config tests' helpers


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    status = cli.main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def config_message(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        validate(load_config(path), str(path))
    return str(info.value)


# -- the config file itself -------------------------------------------------------------------
def test_directory_as_config_is_a_one_line_error_with_exit_2(tmp_path, capsys):
    status, out, err = run_cli(["run", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert status == 2
    assert err == f"error: config {tmp_path} is a directory, not a TOML file\n"
    assert not (tmp_path / "out").exists()


def test_unreadable_config_is_a_one_line_error_with_exit_2(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, METHOD)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    status, _, err = run_cli(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 2
    assert err == f"error: cannot read config {path}: Permission denied\n"


def test_config_that_is_not_text_names_the_file(tmp_path, capsys):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"rounds = 3\n\xff\xfe")
    status, _, err = run_cli(["run", str(path)], capsys)
    assert status == 2
    assert err == f"error: config {path} is not UTF-8 text (byte 11)\n"


# -- attacks ----------------------------------------------------------------------------------
def test_misspelled_attack_option_lists_the_attacks_own_options(tmp_path, capsys):
    path = write(tmp_path, '[attack]\nname = "bit_flip"\nscael = 2.0\n' + METHOD)
    status, _, err = run_cli(["run", str(path)], capsys)
    assert status == 2
    assert err.splitlines() == [
        f"error: invalid config {path}:",
        "  attack: bit_flip.scael is not an option (did you mean 'scale'?); attack 'bit_flip' accepts the "
        "fields: source (default 'own'), client (default 0), scale (default 1.0)",
    ]


def test_misspelled_option_of_a_wrapped_attack_names_the_inner_attack(tmp_path):
    path = write(tmp_path, '[attack]\nname = "optimised"\nbase = { name = "alie", zz = 1.0 }\n' + METHOD)
    message = config_message(path)
    assert "attack: optimised.base: alie.zz is not an option" in message
    assert "attack 'alie' accepts the fields: z (default None)" in message
    assert "__init__" not in message and "unexpected keyword" not in message


def test_unknown_attack_lists_the_names_once_with_a_suggestion(tmp_path):
    import attacks

    message = config_message(write(tmp_path, '[attack]\nname = "bitflip"\n' + METHOD))
    names = ["none", *sorted(attacks.REGISTRY)]
    assert f"attack.name: unknown attack 'bitflip' (did you mean 'bit_flip'?); allowed: {names}" in message
    assert message.count("'large_gradient'") == 1


def test_no_attack_with_options_is_refused_naming_the_option(tmp_path):
    """``name = "none"`` takes no options: one given is a mistake (a misspelled attack
    name's options), not something to ignore."""
    message = config_message(write(tmp_path, '[attack]\nname = "none"\nscale = 3.0\n' + METHOD))
    assert "attack: none.scale is not an option" in message and "accepts the fields: none" in message


def test_attack_listing_shows_no_internal_field(capsys):
    status, out, _ = run_cli(["attacks"], capsys)
    assert status == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  optimised "))
    shown = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        if line.startswith("      ") and not line.startswith("       "):  # a parameter, not a continuation
            shown.append(line.split(":")[0].strip())
    assert shown == ["base", "scales", "line_evaluations", "line_step", "refine_evaluations", "search_every",
                     "warm_refine_evaluations"]  # not `attack`


def test_catalog_skips_fields_the_class_sets_itself():
    import dataclasses

    from robust_pfl.catalog import parameters_of

    @dataclasses.dataclass(frozen=True)
    class Example:
        width: int
        depth: int = 2
        cache: dict = dataclasses.field(init=False, default_factory=dict)

    assert parameters_of(Example) == (("width", "required"), ("depth", "default 2"))


# -- methods and aggregators ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, line",
    [
        (
            '[[methods]]\nname = "global"\naggregator = { name = "krum", f = -1 }\n',
            "  methods[0].aggregator: krum.f must be an integer >= 0 or None, got -1",
        ),
        (
            '[task]\nclusters = 1\n[theory]\nestimate = ["Delta"]\n' + METHOD,
            "  theory.estimate: 'Delta' and 'momentum' compare clusters and need task.clusters >= 2, got 1",
        ),
        (
            '[[methods]]\nname = "fc"\nradius = { policy = "quantile", q = 2.0 }\n',
            None,
        ),
    ],
    ids=["aggregator", "theory-estimate", "radius"],
)
def test_our_messages_pass_through_pydantic_without_its_prefix(tmp_path, text, line):
    message = config_message(write(tmp_path, text))
    assert "Value error" not in message
    if line is not None:
        assert line in message.splitlines()


@pytest.mark.parametrize(
    "text",
    [
        '[[methods]]\nname = "fc"\nbogus = 1\n',
        '[[methods]]\nname = "no_such_method"\n',
        '[attack]\nname = "large_gradient"\nstd = -1.0\n' + METHOD,
        METHOD + METHOD,
        '[byzantine]\ntotal = 5\n[[methods]]\nname = "global"\naggregator = { name = "krum", f = 10 }\n',
    ],
    ids=["method-option", "method-name", "attack-option", "labels", "client-count"],
)
def test_errors_about_methods_and_attacks_name_the_file(tmp_path, text):
    path = write(tmp_path, text, "experiment.toml")
    assert config_message(path).startswith(f"invalid config {path}:\n  ")


@pytest.mark.parametrize(
    "text, line",
    [
        ("roundz = 5\n" + METHOD, "  roundz: unknown key (did you mean 'rounds'?)"),
        ("[task]\nclients_per_clustr = 3\n" + METHOD,
         "  task.clients_per_clustr: unknown key (did you mean 'clients_per_cluster'?)"),
        ('[task]\nname = "image"\nrotation_stepp = 2\n' + METHOD,
         "  task.rotation_stepp: unknown key (did you mean 'rotation_step'?)"),
        ("[byzantine]\ntotl = 1\n" + METHOD, "  byzantine.totl: unknown key (did you mean 'total'?)"),
        ('[theory]\nestimate = ["A"]\neveryy = 3\n' + METHOD, "  theory.everyy: unknown key (did you mean 'every'?)"),
        ('[[methods]]\nname = "fc"\nradiuss = 0.5\n', "  methods[0].radiuss: unknown key (did you mean 'radius'?)"),
        ('[[methods]]\nname = "fc"\nlable = "x"\n', "  methods[0].lable: unknown key (did you mean 'label'?)"),
        ('[[methods]]\nname = "fcc"\n', None),
    ],
    ids=["top-level", "synthetic-task", "image-task", "byzantine", "theory", "method", "method-label", "method-name"],
)
def test_misspelled_key_gets_did_you_mean(tmp_path, text, line):
    message = config_message(write(tmp_path, text))
    if line is None:
        assert "unknown method 'fcc' (did you mean 'fc'?)" in message
    else:
        assert line in message.splitlines()


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ('aggregator = { name = "krum", ff = 1 }', "krum.ff is not an option (did you mean 'f'?)"),
        ('aggregator = "krumm"', "got 'krumm' (did you mean 'krum'?)"),
        ('aggregator = { name = "bucketing", inner = { name = "krum", ff = 1 } }',
         "bucketing.inner: krum.ff is not an option (did you mean 'f'?)"),
    ],
)
def test_misspelled_aggregator_names_and_options_get_did_you_mean(tmp_path, spec, fragment):
    message = config_message(write(tmp_path, f'[[methods]]\nname = "global"\n{spec}\n'))
    assert fragment in message and "Value error" not in message


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ('{ policy = "quantile", qq = 0.2 }',
         "radius.qq is not an option (did you mean 'q'?); radius policy 'quantile' accepts the fields: "
         "q (required), factor (default 1.0), strict (default False)"),
        ('{ policy = "quantil", q = 0.2 }', "got 'quantil' (did you mean 'quantile'?)"),
    ],
)
def test_misspelled_radius_names_and_options_get_did_you_mean(tmp_path, spec, fragment):
    message = config_message(write(tmp_path, f'[[methods]]\nname = "fc"\nradius = {spec}\n'))
    assert fragment in message


def test_misspelled_model_option_gets_did_you_mean(tmp_path):
    text = '[task]\nname = "image"\nmodel = { name = "mlp", hiden = [8] }\n' + METHOD
    message = config_message(write(tmp_path, text))
    assert message.splitlines()[1] == "  task: model.hiden is not an option of 'mlp' (did you mean 'hidden'?); allowed: ['hidden', 'loss']"


# -- --help -----------------------------------------------------------------------------------
def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_help_texts_have_no_rest_markup():
    texts = [parser.format_help() for parser in _parsers(cli.build_parser())]
    assert len(texts) >= 9  # the top level, every command and `theory report`
    assert all("``" not in text for text in texts)
    assert "robust-pfl run CONFIG.toml" in texts[0]


# -- too many clients for the data ------------------------------------------------------------
def test_too_many_clients_for_the_digits_is_a_config_error_with_the_limit(tmp_path, capsys):
    text = QUICKSTART.read_text().replace("clients_per_cluster = 10", "clients_per_cluster = 500")
    assert "clients_per_cluster = 500" in text
    path = write(tmp_path, text, "big.toml")
    status, _, err = run_cli(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and "Traceback" not in err
    assert err.startswith(f"error: invalid config {path}:\n  task.clients_per_cluster: ")
    limit = int(re.search(r"fits at most clients_per_cluster = (\d+)", err).group(1))
    # the limit is the largest value that builds (with the quick start's 4 Byzantine clients)
    task = dict(kind="private_label", clusters=4)
    ImageTask(**task, clients_per_cluster=limit).build(0, ByzantinePlacement(total=4))
    with pytest.raises(ValueError, match="clients_per_cluster"):
        ImageTask(**task, clients_per_cluster=limit + 1).build(0, ByzantinePlacement(total=4))



@pytest.mark.parametrize("field", ["clusters", "clients_per_cluster"])
def test_a_federation_of_10_to_the_12_clients_is_refused_naming_its_field(tmp_path, capsys, field):
    """Sizes far past the data are refused by arithmetic, naming the field that is too
    large (not the Byzantine count), instead of allocating one entry per client."""
    text = QUICKSTART.read_text().replace(f"\n{field} = ", f"\n{field} = 1000000000000 # ", 1)
    assert f"{field} = 1000000000000" in text
    path = write(tmp_path, text, "huge.toml")
    status, _, err = run_cli(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and "Traceback" not in err
    assert err.startswith(f"error: invalid config {path}:\n  task.{field}: ")
    assert ("fits at most clients_per_cluster" in err) == (field == "clients_per_cluster")

def _idx(shape: tuple[int, ...], payload: bytes = b"") -> bytes:
    return bytes([0, 0, 0x08, len(shape)]) + b"".join(struct.pack(">i", size) for size in shape) + payload


def test_idx_set_with_zero_images_is_a_config_error_naming_the_file(tmp_path, capsys):
    data = tmp_path / "mnist"
    data.mkdir()
    for role, name in IDX_FILES.items():
        (data / name).write_bytes(_idx((0, 28, 28) if role.endswith("images") else (0,)))
    path = write(tmp_path, f'[task]\nname = "image"\ndataset = "mnist"\ndata_dir = "{data}"\n' + METHOD)
    status, _, err = run_cli(["run", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and "Traceback" not in err
    images = data / IDX_FILES["train_images"]
    assert f"  task.data_dir: {images}: holds 0 images; every split needs at least one" in err.splitlines()


# -- IDX headers ------------------------------------------------------------------------------
def test_negative_idx_dimension_is_named():
    with pytest.raises(DatasetError) as info:
        parse_idx(_idx((-5,)), "labels.idx")
    assert str(info.value) == "labels.idx: corrupt header: dimension 0 of shape [-5] is negative (-5)"


def test_idx_dimension_larger_than_the_file_is_named():
    big = 2**31 - 1
    with pytest.raises(DatasetError) as info:
        parse_idx(_idx((3, big, 2), bytes(10)), "images.idx")
    assert str(info.value) == (
        f"images.idx: dimension 1 of the header's shape [3, {big}, 2] is {big}, more values than the "
        "10 bytes of data hold (a corrupt header or a truncated file)"
    )


def test_idx_sizes_whose_product_overflows_int64_are_counted_exactly():
    shape = (100_000,) * 4  # 1e20 bytes: past int64, yet each dimension fits the payload
    with pytest.raises(DatasetError) as info:
        parse_idx(_idx(shape, bytes(100_000)), "images.idx")
    assert f"expected {10**20} bytes of data for shape {list(shape)}, found 100000" in str(info.value)


@settings(max_examples=200, deadline=None)
@given(
    shape=st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 4), min_size=1, max_size=3),
    payload=st.integers(0, 48),
)
def test_any_idx_header_parses_or_names_the_file(shape, payload):
    """Any int32 sizes: either the array of that shape, or a DatasetError naming the
    file that never reports a negative byte count."""
    try:
        array = parse_idx(_idx(tuple(shape), bytes(payload)), "f.idx")
    except DatasetError as error:
        assert str(error).startswith("f.idx: ")
        assert not re.search(r"-\d+ bytes", str(error))
    else:
        assert array.shape == tuple(shape) and int(np.prod(shape)) == payload


# -- quick modes ------------------------------------------------------------------------------
def test_fig3_quick_says_it_checks_nothing_and_exits_0(tmp_path, monkeypatch, capsys):
    from robust_pfl.recipes import fig3

    from robust_pfl.engine.results import ResultTable

    def run_method(spec, config, seed, on_round=None, task=None):  # every method the same: FC beats nothing
        table = ResultTable()
        for round_index in (0, config.rounds):
            table.add(spec.display, seed, round_index, {"param_error": 1.0, "validation_loss": 1.0, "test_loss": 1.0})
        return table

    monkeypatch.setattr(fig3, "run_method", run_method)
    status, out, _ = run_cli(["reproduce", "fig3", "--quick", "--out", str(tmp_path)], capsys)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not all(summary["checks"].values())  # the claims fail ...
    assert status == 0 and "FAILED" not in out  # ... and quick mode does not claim to check them
    assert f"  {fig3.QUICK_NOTE}" in out.splitlines()
    assert summary["checked"] is False and summary["mode"] == "quick"
    table = (tmp_path / "fig3.md").read_text()
    assert fig3.QUICK_NOTE in table and "[ ]" not in table
    assert sorted(line for line in table.splitlines() if line.startswith("- ")) == sorted(
        f"- [not checked] {claim}" for claim in summary["checks"]
    )


def _fig3_summary(quick: bool) -> dict:
    """A summary in which FC is worse than Local at K = 4, n = 4 (so that claim fails)."""
    from robust_pfl.recipes import fig3

    def result(error: float) -> dict:
        return {"param_error": error, "rounds_to_1e-6_per_seed": [None]}

    good = {"FC": result(1.0), "Local": result(2.0), "Global": result(3.0), "GT": result(1.0)}
    settings = {"K=4,n=4": {**good, "FC": result(2.5)}, "K=4,n=16": good}
    return {"seconds": 0.0, "settings": settings, "checks": fig3.acceptance_checks(settings), "checked": not quick}


@pytest.mark.parametrize("quick", [False, True])
def test_fig3_exits_1_on_a_failed_check_unless_quick(tmp_path, monkeypatch, capsys, quick):
    from robust_pfl.recipes import fig3

    monkeypatch.setattr(fig3, "run", lambda out, quick=False, seeds=None: _fig3_summary(quick))
    status, out, _ = run_cli(["reproduce", "fig3", *(["--quick"] if quick else []), "--out", str(tmp_path)], capsys)
    if quick:
        assert status == 0 and "FAILED" not in out and f"  {fig3.QUICK_NOTE}" in out.splitlines()
    else:
        assert status == 1 and "  [FAILED] K=4,n=4: FC below Local" in out.splitlines()
        assert "  [ok] K=4,n=16: FC below Local" in out.splitlines()


def _tiny_attack_table(tmp_path, monkeypatch, attack_table, rounds: int) -> Path:
    """The synthetic table shrunk to two attacks and two defenses; the output folder."""
    text = (attack_table.CONFIGS / "attack_table.toml").read_text().split("[[methods]]")[0]
    text = re.sub(r"(?m)^rounds = .*$", f"rounds = {rounds}", text)
    text = re.sub(r"(?m)^seeds = .*$", "seeds = [0]", text)
    for label, spec in (("median", 'name = "global"\naggregator = "median"'), ("MC", 'name = "mc"\nclusters = 1')):
        text += f'[[methods]]\nlabel = "{label}"\n{spec}\nlr = 0.01\nheavy_ball = 0.9\n'
    text += '[grid]\nattack = [{ name = "none" }, { name = "large_gradient" }]\n'
    (tmp_path / "attack_table.toml").write_text(text)
    monkeypatch.setattr(attack_table, "CONFIGS", tmp_path)
    tiny = attack_table.Table("attack_table.toml", attack_table.Mode(rounds=10, seeds=1), "relative_error")
    monkeypatch.setattr(attack_table, "TABLES", {"synthetic": tiny})
    return tmp_path / "out"


def test_attack_table_quick_says_it_is_a_smoke_run(tmp_path, monkeypatch, capsys):
    from robust_pfl.recipes import attack_table

    out_dir = _tiny_attack_table(tmp_path, monkeypatch, attack_table, rounds=300)
    status, out, _ = run_cli(["attack-table", "--quick", "--out", str(out_dir)], capsys)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert status == 0 and summary["mode"] == "quick"
    breaks = summary["tables"]["synthetic"]["breaks"]
    unconverged = [d for d in ("median", "MC") if f"none | {d}" in breaks]
    assert unconverged  # 10 rounds leave a defense short of 1e-2 even without an attack
    note = out.splitlines()[0]
    assert note.startswith("Quick mode (10 rounds, 1 seed(s)): a smoke run, not the attack table.")
    assert f"(marked ✗ here without any attack: {', '.join(unconverged)})" in note
    assert "the full run (300 rounds, 1 seeds)" in note
    assert (out_dir / "attack_table.md").read_text().startswith(note + "\n")


def test_attack_table_full_run_has_no_quick_note(tmp_path, monkeypatch, capsys):
    from robust_pfl.recipes import attack_table

    out_dir = _tiny_attack_table(tmp_path, monkeypatch, attack_table, rounds=10)
    status, out, _ = run_cli(["attack-table", "--out", str(out_dir)], capsys)
    assert status == 0 and "Quick mode" not in out
    assert "Quick mode" not in (out_dir / "attack_table.md").read_text()
    assert json.loads((out_dir / "summary.json").read_text())["mode"] == "full"


def test_too_many_byzantine_clients_blame_the_byzantine_table(tmp_path):
    """400 Byzantine clients leave no digits test image per client whatever
    clients_per_cluster is: the error names ``byzantine``, not the task."""
    text = ('[task]\nname = "image"\ndataset = "digits"\nclusters = 4\nclients_per_cluster = 10\n'
            "[byzantine]\ntotal = 400\n" + METHOD)
    message = config_message(write(tmp_path, text))
    assert "\n  byzantine: 400 Byzantine clients" in message and "lower byzantine.total" in message
    assert "task.clients_per_cluster:" not in message


def test_missing_image_files_name_the_config_key_a_run_reads(tmp_path, monkeypatch):
    """``run`` has no ``--data-dir``: the hint names ``data_dir`` in ``[task]``."""
    monkeypatch.delenv("ROBUST_PFL_DATA", raising=False)
    text = ('[task]\nname = "image"\ndataset = "mnist"\n'
            f'data_dir = "{tmp_path / "nothing"}"\n' + METHOD)
    message = config_message(write(tmp_path, text))
    assert 'data_dir = "DIR" in the config\'s [task] table' in message


@pytest.mark.parametrize("kind", ["array", "inline table", "dotted key"])
def test_deeply_nested_configs_and_grids_are_config_errors(kind, tmp_path):
    """600 nested arrays or inline tables (the TOML parser recurses), or a key 3000
    levels deep (copying recurses): a config error, never a RecursionError."""
    junk = {"array": "[" * 600 + "]" * 600, "inline table": "{ a = " * 600 + "1" + " }" * 600,
            "dotted key": None}[kind]
    line = "a." * 3000 + "b = 1" if junk is None else f"junk = {junk}"
    path = write(tmp_path, line + "\n" + METHOD)
    with pytest.raises(ConfigError, match="deep"):
        load_config(path)
    grid = tmp_path / "grid.toml"
    grid.write_text(line + "\n" + METHOD + "[grid]\nseed = [0]\n")
    from robust_pfl.grid_file import expand_grid, read_grid_file

    with pytest.raises(ConfigError, match="deep"):
        read_grid_file(grid)
    nested: dict = {"b": 1}
    for _ in range(3000):  # the same from Python (robust_pfl.run_grid's dict)
        nested = {"a": nested}
    with pytest.raises(ConfigError, match="nests more than 32 levels deep"):
        expand_grid({"seeds": [0], "methods": [{"name": "local"}], "grid": {"x": [nested]}}, "<dict>")


VALID_AT_LOAD_BEFORE = {  # each used to pass validation and then fail (or run meaninglessly)
    "knn_per on a regression": ({"methods": [{"name": "knn_per"}]}, "methods[0].name", "classification task"),
    "forged target past the models": ({"methods": [{"name": "fc"}, {"name": "ifca"}], "byzantine": {"total": 1},
                                       "attack": {"name": "forged_loss", "target": 7}},
                                      "attack", "reports losses on 4 models (methods[1] = 'ifca')"),
    "lr past float32": ({"methods": [{"name": "fc", "lr": 1e308}]}, "methods[0].lr", "float32 holds"),
    "infinite lr": ({"methods": [{"name": "fc", "lr": math.inf}]}, "methods[0].lr", "finite number > 0"),
    "infinite ditto lambda": ({"methods": [{"name": "ditto", "lambda": math.inf}]}, "methods[0].lambda", "finite"),
    "infinite noise": ({"task": {"noise": math.inf}, "methods": [{"name": "fc"}]}, "task.noise", "finite"),
    "dimension past memory": ({"task": {"dim": 10**12}, "methods": [{"name": "fc"}]}, "task", "GiB"),
    "clients past memory": ({"task": {"clients_per_cluster": 10**9}, "methods": [{"name": "fc"}]}, "task", "GiB"),
}


@pytest.mark.parametrize("case", list(VALID_AT_LOAD_BEFORE))
def test_configs_that_would_fail_at_run_time_are_refused_at_load(case):
    from robust_pfl.config import parse_config

    data, field, words = VALID_AT_LOAD_BEFORE[case]
    with pytest.raises(ConfigError) as caught:
        validate(parse_config(data))
    assert f"\n  {field}: " in str(caught.value) and words in str(caught.value)


def test_a_constant_past_float32s_range_is_sent_as_inf_and_no_honest_model_breaks():
    import robust_pfl

    config = {"seeds": [0], "rounds": 2, "task": {"clusters": 2, "clients_per_cluster": 3}, "byzantine": {"total": 1},
              "attack": {"name": "constant", "value": 1e39}, "methods": [{"name": "fc"}, {"name": "global"}]}
    frame = robust_pfl.run(config, progress=False)
    assert (frame[frame.metric == "nonfinite_models"].value == 0).all()


def test_field_names_in_errors_are_as_the_user_wrote_them():
    """pydantic labels the members of an untagged union (``aggregator.str``,
    ``aggregator.dict[str,any]``); the error names the field once, as written."""
    from robust_pfl.config import parse_config

    with pytest.raises(ConfigError) as caught:
        validate(parse_config({"methods": [{"name": "global", "aggregator": 5}]}))
    lines = str(caught.value).splitlines()[1:]
    assert lines == ["  methods[0].aggregator: must be a string or a table, got 5"]


def test_a_key_with_control_characters_is_quoted_and_the_error_stays_one_line_per_field():
    from robust_pfl.config import parse_config

    for data in ({"methods": [{"name": "cfl", "\x1e": []}]}, {"attack": {"name": "alie", "a b": 1}, "methods": [{"name": "fc"}]}):
        with pytest.raises(ConfigError) as caught:
            validate(parse_config(data))
        lines = str(caught.value).splitlines()
        assert len(lines) == 2 and ('"\\u001e"' in lines[1] or '"a b"' in lines[1]), lines
