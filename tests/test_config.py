"""Experiment configuration: valid TOML loads; every invalid field raises ConfigError with
a message naming the field (dotted path, ``methods[i]`` for methods), before any work."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

import defenses
import attacks
from robust_pfl.config import ConfigError, ExperimentConfig, load_config, parse_config
from robust_pfl.experiments import validate

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.toml"

METHOD = '[[methods]]\nname = "local"\n'


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_and_validate(path: Path) -> ExperimentConfig:
    return validate(load_config(path))


# -- valid configs --------------------------------------------------------------------------
def test_quickstart_config_loads_and_validates():
    """The shipped config is valid, and what is loaded is what the file says (compared
    with a plain TOML parse, so the test follows edits of the file's values)."""
    raw = tomllib.loads(QUICKSTART.read_text())
    config = load_and_validate(QUICKSTART)
    for key in ("seeds", "rounds", "eval_every", "dtype", "batch_size", "device"):
        if key in raw:
            assert getattr(config, key) == raw[key], key
    for key, value in raw.get("task", {}).items():
        assert getattr(config.task, key) == value, f"task.{key}"
    for key, value in raw.get("byzantine", {}).items():
        assert getattr(config.byzantine, key) == value, f"byzantine.{key}"
    attack = dict(raw.get("attack", {}))
    assert config.attack.name == attack.pop("name", "none")
    assert config.attack.options() == attack
    assert len(config.methods) == len(raw["methods"]) >= 1
    for method, table in zip(config.methods, raw["methods"]):
        table = dict(table)
        assert method.name == table.pop("name")
        assert method.label == table.pop("label", None)
        assert method.options() == table
        assert method.name in defenses.REGISTRY


def test_minimal_config_gets_defaults(tmp_path):
    config = load_and_validate(write(tmp_path, METHOD))
    assert config.attack.name == "none"
    assert config.byzantine.total == 0 and config.byzantine.per_cluster == 0
    assert config.device == "cpu"
    assert config.dtype in ("float32", "float64")
    assert len(config.seeds) >= 1
    assert config.methods[0].display == "local"


def test_labels_allow_the_same_method_twice(tmp_path):
    text = """
    [[methods]]
    name = "fc"
    label = "fc-q02"
    radius = { policy = "quantile", q = 0.2 }
    [[methods]]
    name = "fc"
    label = "fc-q05"
    radius = { policy = "quantile", q = 0.5 }
    """
    config = load_and_validate(write(tmp_path, text))
    assert [m.display for m in config.methods] == ["fc-q02", "fc-q05"]
    # the label is not passed on as an algorithm option
    assert "label" not in config.methods[0].options()


# -- invalid configs: each must name the offending field ------------------------------------
INVALID = {
    "unknown top-level key": ("roundz = 5\n" + METHOD, ["roundz"]),
    "rounds = 0": ("rounds = 0\n" + METHOD, ["rounds"]),
    "eval_every = 0": ("eval_every = 0\n" + METHOD, ["eval_every"]),
    "empty seeds": ("seeds = []\n" + METHOD, ["seeds"]),
    "dtype float16": ('dtype = "float16"\n' + METHOD, ["dtype", "float32", "float64"]),
    "device tpu": ('device = "tpu"\n' + METHOD, ["device", "tpu"]),
    "batch_size = 0": ("batch_size = 0\n" + METHOD, ["batch_size"]),
    "task.clusters = 0": ("[task]\nclusters = 0\n" + METHOD, ["task.clusters"]),
    "unknown task key": ("[task]\nwidth = 3\n" + METHOD, ["task.width"]),
    "task.optimum": ('[task]\noptimum = "uniform"\n' + METHOD, ["task.optimum"]),
    "negative byzantine": ("[byzantine]\ntotal = -1\n" + METHOD, ["byzantine.total"]),
    "no methods": ("rounds = 3\n", ["methods"]),
    "unknown method": ('[[methods]]\nname = "no_such_method"\n', ["methods[0]", "no_such_method"]),
    "fc radius q = 2": (
        '[[methods]]\nname = "fc"\nradius = { policy = "quantile", q = 2 }\n',
        ["methods[0]", "radius"],
    ),
    "fc unknown radius policy": (
        '[[methods]]\nname = "fc"\nradius = { policy = "median" }\n',
        ["methods[0]", "radius", "policy"],
    ),
    "negative fixed radius": ('[[methods]]\nname = "fc"\nradius = -1.0\n', ["methods[0]", "radius"]),
    "lr = -1": ('[[methods]]\nname = "local"\nlr = -1\n', ["methods[0]", "lr"]),
    "second method bad": (
        METHOD + '[[methods]]\nname = "global"\nheavy_ball = 1.5\n',
        ["methods[1]", "heavy_ball"],
    ),
    "unknown method option": ('[[methods]]\nname = "fc"\nbogus = 1\n', ["methods[0]", "bogus"]),
    "unknown attack": ('[attack]\nname = "no_such_attack"\n' + METHOD, ["attack", "no_such_attack"]),
    "bad attack option": ('[attack]\nname = "large_gradient"\nstd = -1.0\n' + METHOD, ["attack", "std"]),
    "unknown attack option": ('[attack]\nname = "large_gradient"\nbogus = 1\n' + METHOD, ["attack", "bogus"]),
    "duplicate labels": (METHOD + METHOD, ["methods", "label"]),
    "label clash": (METHOD + '[[methods]]\nname = "global"\nlabel = "local"\n', ["methods", "label"]),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_config_raises_config_error_naming_the_field(tmp_path, case):
    text, fields = INVALID[case]
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_and_validate(path)
    message = str(info.value)
    for field in fields:
        assert field in message, f"{field!r} not in {message!r}"


def test_unknown_method_message_lists_allowed_names(tmp_path):
    path = write(tmp_path, '[[methods]]\nname = "fcc"\n')
    with pytest.raises(ConfigError) as info:
        load_and_validate(path)
    for name in defenses.REGISTRY:
        assert name in str(info.value)


def test_unknown_attack_message_lists_allowed_names(tmp_path):
    path = write(tmp_path, '[attack]\nname = "bitflip"\n' + METHOD)
    with pytest.raises(ConfigError) as info:
        load_and_validate(path)
    for name in ["none", *attacks.REGISTRY]:
        assert name in str(info.value)


@pytest.mark.parametrize(
    "attack",
    ['name = "constant"\nvalue = "abc"', 'name = "large_gradient"\nmean = "abc"'],
    ids=["constant-value-string", "large-gradient-mean-string"],
)
def test_attack_option_types_are_checked_at_load_time(tmp_path, attack):
    """A mistyped attack option must fail validation (ConfigError naming the field),
    not crash the run with a TypeError when the attack is first called."""
    text = f"[attack]\n{attack}\n" + METHOD
    with pytest.raises(ConfigError) as info:
        load_and_validate(write(tmp_path, text))
    assert "attack" in str(info.value)
    assert ("value" if "constant" in attack else "mean") in str(info.value)


def test_cuda_device_rejected_when_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = write(tmp_path, 'device = "cuda"\n' + METHOD)
    config = load_config(path)  # the pattern is valid ...
    with pytest.raises(ConfigError) as info:
        validate(config)  # ... but the device is not there
    assert "device" in str(info.value)


def test_missing_file_and_invalid_toml_raise_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.toml")
    assert "absent.toml" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "rounds = = 3\n", "broken.toml"))
    assert "broken.toml" in str(info.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# -- wrongly typed options: a config error naming the field, never a TypeError ---------------
HOSTILE_RADIUS = {
    "q list": ('{ policy = "quantile", q = [0.2] }', "radius.q"),
    "q string": ('{ policy = "quantile", q = "0.2" }', "radius.q"),
    "q bool": ('{ policy = "quantile", q = true }', "radius.q"),
    "factor string": ('{ policy = "quantile", q = 0.2, factor = "x" }', "radius.factor"),
    "tau string": ('{ policy = "fixed", tau = "1" }', "radius.tau"),
    "c list": ('{ policy = "theory", delta = 0.5, sigma = 1.0, separation = 1.0, c = [1] }', "radius.c"),
    "strict int": ('{ policy = "quantile", q = 0.2, strict = 1 }', "radius.strict"),
    "iterations float": ('{ policy = "cd", iterations = 2.5 }', "radius.iterations"),
    "policy list": ('{ policy = ["quantile"] }', "radius.policy"),
    "policy table": ("{ policy = { x = 1 } }", "radius.policy"),
    "radius string": ('"0.2"', "radius must be"),
    "radius bool": ("true", "radius must be"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RADIUS))
def test_wrongly_typed_radius_is_a_config_error_naming_the_field(tmp_path, case):
    spec, field = HOSTILE_RADIUS[case]
    for method in ("fc", "mc", "myopic"):
        path = write(tmp_path, f'[[methods]]\nname = "{method}"\nradius = {spec}\n')
        try:
            load_and_validate(path)
        except ConfigError as error:
            message = str(error)
        else:
            pytest.fail(f"radius = {spec} was accepted")
        assert "methods[0].radius: " in message and field in message, message
        assert "got " in message, message  # what was given is shown


def test_radius_is_parsed_once_into_the_policy_the_algorithm_uses(tmp_path):
    from defenses.radius import QuantileRadius

    text = '[[methods]]\nname = "fc"\nradius = { policy = "quantile", q = 0.3 }\n'
    config = load_and_validate(write(tmp_path, text))
    params = defenses.REGISTRY["fc"].Params(**config.methods[0].options())
    assert params.radius == QuantileRadius(0.3) and params.radius_policy() is params.radius
    assert defenses.REGISTRY["fc"].Params().radius == QuantileRadius(0.2)  # the default, parsed too
    assert config.methods[0].options()["radius"] == {"policy": "quantile", "q": 0.3}  # the config keeps the spec


@pytest.mark.parametrize(
    "text, words",
    [
        ('[[methods]]\nname = "global"\naggregator = { name = { a = 1 } }\n',
         ["methods[0].aggregator", "aggregator.name must be one of", "got {'a': 1}"]),
        ('[[methods]]\nname = "global"\naggregator = { name = "krum", f = true }\n',
         ["methods[0].aggregator", "krum.f must be an integer >= 0 or None, got True"]),
        ('[[methods]]\nname = "global"\naggregator = { name = "bucketing", inner = { name = [1] } }\n',
         ["methods[0].aggregator", "bucketing.inner: aggregator.name"]),
        ('[attack]\nname = "bit_flip"\nscale = "2"\n' + METHOD,
         ["attack", "bit_flip.scale must be a finite number, got '2'"]),
        ('[attack]\nname = "forged_loss"\npayload = { a = 1 }\n' + METHOD,
         ["attack", "forged_loss.payload must be a string"]),
        ('[attack]\nname = "optimised"\nbase = { name = ["alie"] }\n' + METHOD, ["attack", "optimised.base"]),
        ('[attack]\nname = "optimised"\nscales = [1.0, true]\n' + METHOD,
         ["attack", "optimised.scales must be a non-empty list"]),
    ],
)
def test_wrongly_typed_aggregator_and_attack_options_are_config_errors(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        load_and_validate(write(tmp_path, text))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_validation_builds_the_attack_once_and_a_changed_copy_builds_its_own():
    """What validation built (``experiments.built``) is reused by every run of the same
    config object, and a copy with other fields never reuses it."""
    from robust_pfl.config import AttackConfig
    from robust_pfl.experiments import built, validate

    config = validate(parse_config({"attack": {"name": "large_gradient"}, "byzantine": {"total": 1},
                                    "methods": [{"name": "global", "aggregator": "median"}]}))
    assert built(config) is built(config)
    assert type(built(config).attack).__name__ == "LargeGradient"
    changed = config.model_copy(update={"attack": AttackConfig(name="bit_flip")})
    assert built(changed).attack.name == "bit_flip"
    assert built(config).attack.name == "large_gradient"
