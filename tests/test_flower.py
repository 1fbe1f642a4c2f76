"""The Flower adapter (robust_pfl.flower): a Flower simulation of a run gives the
simulator's honest models, and a bad ``[flower]`` config fails at load naming its field.

The config checks run without flwr; the simulations need ``pip install 'robust-pfl[flower]'``
and are skipped without it.  Nodes import the run's plug-ins, and a node that fails is
counted in summary.json and fails the command."""

from __future__ import annotations

import copy
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from robust_pfl.config import ConfigError

#: 8 honest + 2 Byzantine clients of the digits "private label" task, 20 rounds.
SMALL: dict[str, Any] = {
    "seeds": [0],
    "rounds": 20,
    "eval_every": 10,
    "batch_size": 16,
    "task": {"name": "image", "dataset": "digits", "kind": "private_label", "clusters": 2,
             "clients_per_cluster": 4, "model": {"name": "mlp", "hidden": [32]}},
    "byzantine": {"total": 2},
    "attack": {"name": "large_gradient", "mean": 1e6, "std": 200.0},
    "methods": [
        {"name": "global", "label": "global+median", "aggregator": "median", "lr": 0.1, "heavy_ball": 0.9},
        {"name": "fc", "groups": 2, "lr": 0.1, "heavy_ball": 0.9, "radius": {"policy": "quantile", "q": 0.2}},
        {"name": "mc", "lr": 0.1, "heavy_ball": 0.9},
    ],
}


def simulated_models(config_data: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each method's final ``[N, d]`` models from the library's own engine."""
    import defenses
    from robust_pfl.config import parse_config
    from robust_pfl.experiments import RunParts, validate

    config = validate(parse_config(copy.deepcopy(config_data)))
    out = {}
    for method in config.methods:
        parts = RunParts.build(config, config.seeds[0])
        algorithm = defenses.build(method.name, parts.federation, method.options())
        algorithm.snapshot_records = False
        for round_index in range(config.rounds):
            algorithm.step(round_index)
        out[method.display] = algorithm.client_models().clone()
    return out


def honest_gap(flower: torch.Tensor, simulated: torch.Tensor, byzantine: torch.Tensor) -> float:
    """Largest absolute difference over the honest clients' parameters."""
    return float((flower[~byzantine] - simulated[~byzantine]).abs().max())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["methods"].append({"name": "knn_per"}), "methods[3].name"),
        (lambda d: d.update(flower={"nodes": 12}), "flower.nodes"),
        (lambda d: d.update(flower={"nodes": "ten"}), "flower.nodes"),
        # Byzantine clients are added to the honest ones: 12 of them need 20 nodes, not 10
        (lambda d: d.update(flower={"nodes": 10}, byzantine={"total": 12}), "byzantine.total"),
        (lambda d: d.update(flower={"gpus": 1}), "flower.gpus"),
        (lambda d: d["task"].update(reshuffle_every_epoch=True), "task.reshuffle_every_epoch"),
        (lambda d: d.update(attack={"name": "badnets"}), "attack.name"),
    ],
)
def test_bad_flower_config_fails_at_load_naming_the_field(change: Any, field: str) -> None:
    from robust_pfl.flower import load_flower_config

    data = copy.deepcopy(SMALL)
    change(data)
    with pytest.raises(ConfigError) as caught:
        load_flower_config(data)
    assert f"{field}:" in str(caught.value)


def test_a_flower_config_names_the_attack_check_a_failed_plugin_skipped() -> None:
    """``robust-pfl flower`` loads a config as ``run`` does: one report with the plug-in
    that did not import, the other mistake, and the attack name left unchecked."""
    from robust_pfl.flower import load_flower_config

    data = copy.deepcopy(SMALL) | {"plugins": ["no_such_plugin_module"], "rounds": 0, "attack": {"name": "bitflip"}}
    with pytest.raises(ConfigError) as caught:
        load_flower_config(data)
    lines = str(caught.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["plugins[0]", "rounds", "attack.name not checked"]
    assert lines[-1].endswith("the plug-ins did not load")


def test_what_flower_wraps_is_read_from_the_algorithms_declarations() -> None:
    """``supported_methods`` / ``node_attack_methods`` are the registered algorithms
    declaring ``Algorithm.flower`` / ``flower_node_attacks`` (the 14 and 7 methods the
    adapter was written for), and a method outside them is refused naming them all."""
    import defenses
    from robust_pfl.flower import load_flower_config, node_attack_methods, supported_methods

    assert set(supported_methods()) == {"global", "fc", "mc", "myopic", "local", "ground_truth", "ditto", "ifca",
                                        "ifca_model_avg", "hypcluster", "cfl", "cgpfl", "clove", "pfl_tc"}
    assert set(node_attack_methods()) == {"global", "fc", "mc", "myopic", "local", "ground_truth", "ditto"}
    assert all(defenses.REGISTRY[name].flower for name in node_attack_methods())
    data = copy.deepcopy(SMALL)
    data["methods"].append({"name": "knn_per"})
    with pytest.raises(ConfigError, match=", ".join(supported_methods())):
        load_flower_config(data)


def test_the_quickstart_config_loads() -> None:
    from robust_pfl.flower import load_flower_config

    run = load_flower_config(Path(__file__).parents[1] / "configs" / "flower_quickstart.toml")
    assert run.clients == 10


def test_a_few_flower_rounds_give_the_simulator_honest_models(tmp_path: Path) -> None:
    """The equivalence of the slow test below on 2 rounds (the second starts from state
    the first left on the nodes and the server), in the default test run: Global +
    median, FC with 2 groups and MC under large gradients sent by the Byzantine nodes;
    the honest models are bit-identical to the simulator's."""
    pytest.importorskip("flwr", reason="the Flower adapter needs flwr: pip install 'robust-pfl[flower]'")
    from robust_pfl.experiments import build_task
    from robust_pfl.flower import load_flower_config, run_flower

    data = copy.deepcopy(SMALL) | {"rounds": 2, "eval_every": 2}
    run = load_flower_config(copy.deepcopy(data))
    summary = run_flower(run, tmp_path)
    simulated = simulated_models(data)
    byzantine = build_task(run.config, 0).byzantine
    for method in run.config.methods:
        assert honest_gap(summary["models"][(method.display, 0)], simulated[method.display], byzantine) == 0.0
    # the Byzantine nodes ran the attack: every one of their replies carried it (Global and
    # MC: one gradient request per node a round; FC: one per exchange of its group)
    runs = {entry["run"]: entry for entry in summary["attack_runs"]}
    assert runs["global+median seed=0"]["byzantine_node_replies"] == 2 * 2
    for method in run.config.methods:
        entry = runs[f"{method.display} seed=0"]
        assert entry["ran_on"] == "nodes" and entry["attack"] == "large_gradient"
        assert entry["node_replies_with_attack"] == entry["byzantine_node_replies"] >= 2 * 2


@pytest.mark.slow
@pytest.mark.parametrize("attack", [
    {"name": "large_gradient", "mean": 1e6, "std": 200.0},   # on the Byzantine nodes
    {"name": "label_flip"},                                   # data attack, on the Byzantine nodes
    {"name": "alie"},                                         # omniscient: in the strategy
])
def test_flower_run_gives_the_simulator_honest_models(tmp_path: Path, attack: dict[str, Any]) -> None:
    pytest.importorskip("flwr", reason="the Flower adapter needs flwr: pip install 'robust-pfl[flower]'")
    from robust_pfl.experiments import build_task
    from robust_pfl.flower import load_flower_config, run_flower

    data = copy.deepcopy(SMALL) | {"attack": attack}
    run = load_flower_config(copy.deepcopy(data))
    summary = run_flower(run, tmp_path)
    simulated = simulated_models(data)
    byzantine = build_task(run.config, 0).byzantine
    for method in run.config.methods:
        gap = honest_gap(summary["models"][(method.display, 0)], simulated[method.display], byzantine)
        # measured 0.0 (bit-identical) for all three methods and attacks; the bound allows
        # float32 rounding of one node's batch against the simulator's batched kernels
        assert gap < 1e-5, (method.display, gap)
    assert (tmp_path / "summary.json").exists() and (tmp_path / "history.csv").exists()
    written = json.loads((tmp_path / "summary.json").read_text())
    assert set(written["final"]) == {m.display for m in run.config.methods}


def test_flower_command_without_flwr_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from robust_pfl.cli import main

    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr now raises ImportError
    config = Path(__file__).parents[1] / "configs" / "flower_quickstart.toml"
    assert main(["flower", str(config)]) == 2
    assert "robust-pfl[flower]" in capsys.readouterr().err


@pytest.mark.slow  # about 15 s of real Flower nodes; the default run keeps the core equivalence test
def test_flower_command_writes_what_run_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``robust-pfl flower`` and ``robust-pfl run`` on one config (FC with 2 groups,
    Global + median, 3 rounds): the same history.csv, byte for byte; the command
    prints where each run's attack ran (large_gradient, a node attack)."""
    pytest.importorskip("flwr", reason="the Flower adapter needs flwr: pip install 'robust-pfl[flower]'")
    import tomllib

    from robust_pfl.cli import main

    data = copy.deepcopy(SMALL) | {"rounds": 3, "eval_every": 1}
    data["methods"] = data["methods"][:2]
    toml = _toml(data)
    assert tomllib.loads(toml)["methods"][1]["groups"] == 2
    config = tmp_path / "small.toml"
    config.write_text(toml + '\n[flower]\nnodes = 10\n')
    plain = tmp_path / "plain.toml"
    plain.write_text(toml)
    assert main(["flower", str(config), "--out", str(tmp_path / "flower")]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["attack_runs"] and all(entry["ran_on"] == "nodes" for entry in summary["attack_runs"])
    assert printed.count("attack 'large_gradient' ran on the Byzantine nodes") == len(summary["attack_runs"])
    assert main(["run", str(plain), "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "flower" / "history.csv").read_bytes() == (tmp_path / "run" / "history.csv").read_bytes()


def _toml(data: dict[str, Any]) -> str:
    """``data`` (a run config of top-level values, lists of values, the task, byzantine
    and attack tables and the methods) as a TOML file's text."""
    lines = [f"{key} = {json.dumps(value)}" for key, value in data.items()
             if not isinstance(value, (dict, list)) or key in ("seeds", "plugins")]
    return "\n".join(lines) + "\n" + _tables(data)


def _tables(data: dict[str, Any]) -> str:
    """The tables of ``data`` as TOML (inline tables for nested values: JSON objects are
    not TOML, so they are written key by key)."""

    def inline(value: Any) -> str:
        if isinstance(value, dict):
            return "{ " + ", ".join(f"{k} = {inline(v)}" for k, v in value.items()) + " }"
        if isinstance(value, list):
            return "[" + ", ".join(inline(v) for v in value) + "]"
        return json.dumps(value)

    out = []
    for key in ("task", "byzantine", "attack"):
        out.append(f"[{key}]\n" + "\n".join(f"{k} = {inline(v)}" for k, v in data[key].items()))
    for method in data["methods"]:
        out.append("[[methods]]\n" + "\n".join(f"{k} = {inline(v)}" for k, v in method.items()))
    return "\n\n".join(out) + "\n"


# -- plug-ins on the nodes, node failures, one file for run and flower -------------------
#: A node-side attack (it needs nothing but the node's own gradient) in a plug-in file.
NEGATIVE_SCALED = textwrap.dedent('''
    import dataclasses

    import attacks


    @attacks.register
    @dataclasses.dataclass(frozen=True)
    class NegativeScaled(attacks.AttackBase):
        """Every Byzantine row: its own honest gradient times -scale."""

        name = "{name}"
        summary = "the node's own gradient times -scale"
        needs = frozenset()
        scale: float = 4.0

        def __call__(self, messages, context):
            return -self.scale * messages[..., context.byzantine, :]
''')

#: A plug-in that breaks the nodes of ``clients``: building their state raises.
BREAKER = textwrap.dedent('''
    import robust_pfl.flower as flower

    _state = flower.NodeState


    def broken(client, *args):
        if client in {clients}:
            raise ValueError(f"the node of client {{client}} is broken")
        return _state(client, *args)


    flower.NodeState = broken
''')


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder for plug-in files; whatever they register or patch in this process
    (attacks, ``robust_pfl.flower.NodeState``, their modules) is undone afterwards."""
    import attacks
    import robust_pfl.flower as flower

    monkeypatch.setattr(flower, "NodeState", flower.NodeState)
    before = set(attacks.REGISTRY)
    yield tmp_path
    for name in set(attacks.REGISTRY) - before:
        attacks.REGISTRY.pop(name)
    for stem in [path.stem for path in tmp_path.glob("*.py")]:
        sys.modules.pop(stem, None)


@pytest.mark.slow  # about 15 s of real Flower nodes; the default run keeps the core equivalence test
def test_a_plugin_attack_runs_on_the_nodes_as_in_the_simulator(plugin_dir: Path) -> None:
    """A node-side attack registered by a plug-in file that the config names by a path
    relative to itself: every node imports the plug-in (no node fails) and the honest
    models of Global + median and FC equal the simulator's under that attack."""
    pytest.importorskip("flwr", reason="the Flower adapter needs flwr: pip install 'robust-pfl[flower]'")
    from robust_pfl.experiments import build_task, built
    from robust_pfl.flower import attack_on_node, load_flower_config, run_flower

    name = f"negative_scaled_{plugin_dir.name[-8:]}".replace("-", "_")
    (plugin_dir / "neg_attack.py").write_text(NEGATIVE_SCALED.format(name=name))
    data = copy.deepcopy(SMALL) | {"rounds": 3, "eval_every": 3, "plugins": ["neg_attack.py"],
                                   "attack": {"name": name, "scale": 4.0}}
    data["methods"] = data["methods"][:2]
    (plugin_dir / "run.toml").write_text(_toml(data))
    run = load_flower_config(plugin_dir / "run.toml")
    assert attack_on_node(built(run.config).attack, "global")  # the nodes run it, not the strategy

    summary = run_flower(run, plugin_dir / "out")
    assert summary["node_failures"] == []
    simulated = simulated_models(data | {"plugins": [str(plugin_dir / "neg_attack.py")]})
    byzantine = build_task(run.config, 0).byzantine
    for method in run.config.methods:
        assert honest_gap(summary["models"][(method.display, 0)], simulated[method.display], byzantine) == 0.0


@pytest.mark.slow  # about 15 s of real Flower nodes; the default run keeps the core equivalence test
def test_failing_nodes_are_counted_per_node_and_fail_the_command(plugin_dir: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """One honest and one Byzantine node that raise at every request: the command
    warns once per node at its first failure, still writes its outputs, exits 1,
    prints each node, and summary.json counts each node's failures (one gradient
    request a round in Global) with the node's error."""
    pytest.importorskip("flwr", reason="the Flower adapter needs flwr: pip install 'robust-pfl[flower]'")
    from robust_pfl.cli import main
    from robust_pfl.config import parse_config
    from robust_pfl.experiments import build_task

    data = copy.deepcopy(SMALL) | {"rounds": 2, "eval_every": 1}
    data["methods"] = data["methods"][:1]
    byzantine = build_task(parse_config(copy.deepcopy(data)), 0).byzantine
    honest_client, byzantine_client = 0, int(byzantine.nonzero()[0][0])
    (plugin_dir / "breaker.py").write_text(BREAKER.format(clients={honest_client, byzantine_client}))
    (plugin_dir / "run.toml").write_text(_toml(data | {"plugins": ["breaker.py"]}))

    with pytest.warns(RuntimeWarning, match="the node of client") as warned:
        assert main(["flower", str(plugin_dir / "run.toml"), "--out", str(plugin_dir / "out")]) == 1
    firsts = [str(w.message) for w in warned if "the node of client" in str(w.message)]
    assert len(firsts) == 2 and all(m.startswith("round 0:") for m in firsts)
    written = json.loads((plugin_dir / "out" / "summary.json").read_text())
    failures = {entry["client"]: entry for entry in written["node_failures"]}
    assert set(failures) == {honest_client, byzantine_client}
    for client, entry in failures.items():
        assert entry["byzantine"] == bool(byzantine[client])
        assert entry["run"] == "global+median seed=0" and entry["count"] == 2 and entry["first_round"] == 0
        assert entry["first_message"] == f"ValueError: the node of client {client} is broken"
    err = capsys.readouterr().err
    assert f"client {honest_client} (honest" in err and f"client {byzantine_client} (Byzantine" in err


def test_a_byzantine_node_failure_alone_is_reported_as_an_attack_not_applied() -> None:
    """Only a Byzantine node failed: the report is not empty (the command exits 1) and
    says the configured attack was not applied; honest nodes are not blamed."""
    from robust_pfl.flower import failure_report

    entry = {"run": "fc seed=0", "client": 9, "node": 7, "byzantine": True, "count": 3, "first_round": 0,
             "first_message": "ValueError: x"}
    report = "\n".join(failure_report([entry], "large_gradient"))
    assert "client 9 (Byzantine" in report and "did not apply the config's attack" in report
    assert "honest nodes failed" not in report
    assert failure_report([], "large_gradient") == []


@pytest.mark.slow  # about 55 s of real Flower nodes; the default run checks attack_runs in the 3-round test
@pytest.mark.parametrize("value", [math.nan, 0.0], ids=["nan", "zero"])
def test_a_node_attack_whose_rows_equal_silence_is_recorded_as_applied(tmp_path: Path, value: float) -> None:
    """``constant`` runs on the Byzantine nodes of Global + median (its ``needs`` are
    empty) and in the strategy of IFCA (not a node-attack method).  With NaN, the row a
    silent node's failed request becomes, or zeros, its rows cannot be told from
    silence, yet summary.json records, per run, where it ran and that every Byzantine
    node reply carried it: 2 rounds x 2 Byzantine nodes x Global's one gradient
    request a round.  No node failed: the NaN rows are the attack's, not failures."""
    pytest.importorskip("flwr", reason="the Flower adapter needs flwr: pip install 'robust-pfl[flower]'")
    from robust_pfl.flower import load_flower_config, run_flower

    data = copy.deepcopy(SMALL) | {"rounds": 2, "eval_every": 2, "attack": {"name": "constant", "value": value}}
    data["methods"] = [data["methods"][0], {"name": "ifca", "lr": 0.1}]
    summary = run_flower(load_flower_config(copy.deepcopy(data)), tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["node_failures"] == []
    runs = {entry["run"]: entry for entry in written["attack_runs"]}
    assert runs["global+median seed=0"] == {
        "run": "global+median seed=0", "attack": "constant", "ran_on": "nodes",
        "node_replies_with_attack": 2 * 2, "byzantine_node_replies": 2 * 2}
    assert runs["ifca seed=0"] == {"run": "ifca seed=0", "attack": "constant", "ran_on": "strategy"}
    assert summary["attack_runs"] == written["attack_runs"]


def test_the_attack_report_says_where_each_run_s_attack_ran() -> None:
    """The printed lines: on the nodes with the count of replies that carried it, in
    the strategy, or no attack."""
    from robust_pfl.flower import attack_report

    lines = attack_report([
        {"run": "global seed=0", "attack": "constant", "ran_on": "nodes", "node_replies_with_attack": 3,
         "byzantine_node_replies": 4},
        {"run": "ifca seed=0", "attack": "alie", "ran_on": "strategy"},
        {"run": "fc seed=0", "attack": "none", "ran_on": "none"},
    ])
    assert lines == ["  global seed=0: attack 'constant' ran on the Byzantine nodes; 3 of their 4 replies carried "
                     "its rows",
                     "  ifca seed=0: attack 'alie' ran in the strategy, before aggregation",
                     "  fc seed=0: no attack"]


def test_which_replies_carry_a_node_s_attack() -> None:
    """A node's reply is its attack's: every reply of a label-poisoning node, gradients
    of a vector attack when the strategy asks for it, never an honest node's."""
    import attacks
    from robust_pfl.flower import NodeState, carries_attack

    def node(attack: Any) -> NodeState:
        return NodeState(0, torch.zeros(1, 2), torch.zeros(1), None, attack, None, 0)

    vector, labels = attacks.build("constant", {}), attacks.build("label_flip", {})
    assert [carries_attack(node(vector), kind, asked) for kind, asked in
            [("gradient", True), ("gradient", False), ("loss", True)]] == [True, False, False]
    assert carries_attack(node(labels), "loss", False) and carries_attack(node(labels), "gradient", False)
    assert not carries_attack(node(None), "gradient", True)


def test_run_takes_the_flower_quickstart_file_without_flwr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``robust-pfl run`` accepts the ``[flower]`` table of the Flower quick start
    (validated, then ignored: it changes no cell key) with flwr unimportable, and
    refuses a bad one naming its field."""
    from robust_pfl.cli import main
    from robust_pfl.config import load_config
    from robust_pfl.grid_file import cell_key

    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr now raises ImportError
    text = (Path(__file__).parents[1] / "configs" / "flower_quickstart.toml").read_text()
    short = text.replace("rounds = 40", "rounds = 1").replace("eval_every = 10", "eval_every = 1")
    assert short != text
    (tmp_path / "quick.toml").write_text(short)
    assert main(["run", str(tmp_path / "quick.toml"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "summary.json").exists()

    config = load_config(tmp_path / "quick.toml")
    assert config.flower is not None and config.flower.nodes == 10
    table = short[short.index("\n[flower]\n"):short.index("\n[[methods]]\n")]
    (tmp_path / "plain.toml").write_text(short.replace(table, ""))
    assert cell_key(load_config(tmp_path / "plain.toml")) == cell_key(config)

    (tmp_path / "bad.toml").write_text(short.replace("cpus_per_node = 1.0", "cpus_per_node = 0.0"))
    with pytest.raises(ConfigError, match=r"flower\.cpus_per_node: must be a number > 0"):
        load_config(tmp_path / "bad.toml")
