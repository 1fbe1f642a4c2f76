"""The library's defenses in a Flower federation: a strategy that drives a registered
algorithm whose clients are Flower ``ClientApp`` nodes (``pip install robust-pfl[flower]``).

How it works.  An algorithm of :mod:`defenses` reads "the clients" only through its
:class:`~robust_pfl.engine.federation.Federation`: ``gradients`` (each client's ``g_i(x_i)``),
``cross_gradients`` (``g_j(x_m)`` for a set of models, FC's messages) and
``deliver`` (the attack's injection point).  :class:`RemoteFederation` is a
federation whose ``gradients`` / ``cross_gradients`` / ``cross_losses`` are answered
by the nodes: each call becomes one Flower ``Message`` per node, carrying the models
that node must evaluate (its own personalised model, or its FC group's models) and
the indices of the samples of this round's batch; the node replies with one vector
per model.  The algorithm itself (aggregation, clustering, the personalised models
of every node) stays in :class:`RobustStrategy`, unchanged: the server code that the
simulator runs is the code that the Flower run runs, and with the same seeds the two
give the same honest models to float tolerance (``tests/test_flower.py``).

Batches.  The strategy draws each round's batch indices from the run's ``batches``
stream exactly as :meth:`robust_pfl.engine.data.ClientData.sample` does and sends each node
its own row (a server-side sampling schedule, the usual way to make a federated run
reproducible); a node never sends data.

Attacks.  Byzantine nodes are ``ClientApp`` nodes like the others:

* a data attack (``label_flip``) poisons the node's own labels; it then sends honest
  gradients of them;
* an attack that needs nothing (``needs`` empty: ``large_gradient``, ``constant``,
  ``bit_flip`` with ``source = "own"``) runs on the node, on its own honest vector,
  with a generator of its own (``(seed, "attack/node<i>")``: its draws differ from
  the simulator's single ``attack`` stream, not their law);
* an omniscient or adaptive attack (ALIE, IPM, min-max, ball-edge, ...) is applied
  by the strategy before aggregation through :meth:`Federation.deliver`, the same
  injection the simulator uses, with the same ``attack`` stream.

Why a Flower ``Strategy`` whose :meth:`RobustStrategy.start` is its own: Flower's
default ``start`` sends one train message per round and aggregates the replies;
FC needs one exchange per group and chunk of receivers, IFCA/HypCluster a loss
exchange before the gradient one, so the strategy runs the algorithm's round and lets
the algorithm ask for what it needs (``configure_train`` / ``aggregate_train`` build
and read those messages).

Plug-ins.  A node process (a Ray actor of the simulation, or a ``SuperNode``) has
imported nothing of the run: the ``ClientApp`` carries the config as plain data and
its plug-ins' source text, and each node imports them and validates the config at
the strategy's first request (:func:`node_config`), before it builds its task or
attack.

Failures.  A node's error reply, a missing reply or a malformed one becomes a NaN row
that every defense drops; the strategy counts them per node (``failures``),
:func:`run_flower` writes them to ``summary.json`` (``node_failures``) and
``robust-pfl flower`` prints them and exits 1.  A node that fails the first request
(it cannot import the plug-ins or validate the config) stops the run (:class:`NodeError`).

Supported methods (:func:`supported_methods`) are those whose clients send one vector
(or one vector per model of their group) per exchange and whose state lives on the
server; see ``docs/flower.md`` for what is not wrapped and why.
"""

from __future__ import annotations

import importlib
import math
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np
import torch
from torch import Tensor

import defenses
from robust_pfl.config import ExperimentConfig, FlowerOptions, ImageTaskConfig, config_error, read_toml_file
from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.seeding import generator as make_generator
from robust_pfl.engine.rounds import run_rounds
from robust_pfl.engine.types import AttackContext, BackdoorAttack
from robust_pfl.experiments import build_task, built, client_count, honest_means, method_params, parse_and_validate
from robust_pfl.plugins import PluginSource, install_sources, shipped_sources

if TYPE_CHECKING:  # flwr is imported lazily: the package works without it
    from flwr.app import ArrayRecord, ConfigRecord, Message
    from flwr.serverapp import Grid

def supported_methods() -> list[str]:
    """The registered methods the adapter wraps (``Algorithm.flower``): all of their
    client work goes through ``Federation.gradients`` / ``cross_gradients`` (one vector
    per model a node evaluates) and their state lives on the server."""
    return sorted(name for name, cls in defenses.REGISTRY.items() if cls.flower)


def node_attack_methods() -> list[str]:
    """The wrapped methods whose message is the gradient the node computes (or, for MC,
    the momentum of its gradients, linear in them), so that a Byzantine node's gradient
    attack acts on that message as in the simulator (``Algorithm.flower_node_attacks``).
    The others upload a model or a pseudo-gradient made by several local steps; there
    the strategy replaces the Byzantine upload through ``deliver``, as the simulator
    does, since an attack on each local gradient would be a different attack."""
    return sorted(name for name, cls in defenses.REGISTRY.items() if cls.flower and cls.flower_node_attacks)


#: The message type every request uses (``ClientApp.query("robust_pfl")``).
ACTION = "query.robust_pfl"

INSTALL_HINT = "the Flower adapter needs flwr: pip install 'robust-pfl[flower]'"


def require_flwr() -> None:
    """Raise ``ImportError`` naming the extra to install when flwr is missing."""
    try:
        importlib.import_module("flwr")
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error


# -- configuration -----------------------------------------------------------------------
@dataclass(frozen=True)
class FlowerRun:
    """A validated Flower run: the run config and its ``[flower]`` options
    (:class:`robust_pfl.config.FlowerOptions`, part of the run config's schema)."""

    config: ExperimentConfig
    options: FlowerOptions
    clients: int


def load_flower_config(data: Mapping[str, Any] | str | Path, source: str | None = None) -> FlowerRun:
    """A Flower run from a TOML path or a mapping; fails at load with
    ``<field>: must be ..., got ...`` for an unsupported method or attack, a node
    count that is not the run's client count, or more Byzantine nodes than nodes."""
    base_dir = None
    if not isinstance(data, Mapping):
        path = Path(data)
        source = source or str(path)
        data = read_toml_file(path, "config")
        base_dir = path.parent
    source = source or "<dict>"
    problems: list[tuple[str, str]] = []
    for index, method in enumerate(data.get("methods") or []):
        name = method.get("name") if isinstance(method, Mapping) else None
        if name not in supported_methods():
            problems.append((f"methods[{index}].name",
                             f"must be a method the Flower adapter wraps ({', '.join(supported_methods())}), "
                             f"got {name!r}"))
    if problems:
        raise config_error(source, problems)
    # one report for every stage, naming the checks a failed stage skipped (docs/config.md)
    config = parse_and_validate(dict(data), source, base_dir=base_dir)
    options = config.flower or FlowerOptions()
    clients = client_count(config)
    byzantine = _byzantine_count(config)
    nodes = options.nodes if options.nodes is not None else clients
    if options.nodes is not None and options.nodes != clients:
        problems.append(("flower.nodes", f"must equal the run's clients ({clients}: one node per client), "
                                         f"got {options.nodes}"))
    if byzantine > nodes:
        problems.append(("byzantine.total", f"must be at most the number of nodes ({nodes}), got {byzantine}"))
    attack = config.attack.name
    built_attack = built(config).attack
    if isinstance(built_attack, BackdoorAttack):
        problems.append(("attack.name", f"must not be a backdoor (its trigger needs pixel statistics the nodes "
                                        f"do not share), got {attack!r}"))
    if config.theory is not None:
        problems.append(("theory", "must be absent in a Flower run (its estimates read every client's data "
                                   "on the server), got a [theory] table"))
    if isinstance(config.task, ImageTaskConfig) and config.task.reshuffle_every_epoch:
        problems.append(("task.reshuffle_every_epoch", "must be false in a Flower run (re-dealing moves data "
                                                       "between nodes), got true"))
    if problems:
        raise config_error(source, problems)
    return FlowerRun(config, options, clients)


def _byzantine_count(config: ExperimentConfig) -> int:
    """How many Byzantine clients ``config`` places (its task's mask)."""
    return int(build_task(config, config.seeds[0]).byzantine.sum())


def attack_on_node(attack: Any, method: str | None = None) -> bool:
    """Whether a Byzantine ``ClientApp`` runs ``attack`` itself (in a run of
    ``method``; ``None``: in some method): a data attack (poisoned labels), or one that
    needs nothing but the node's own vector in a method of
    :func:`node_attack_methods`; every other attack is applied by the strategy
    through :meth:`Federation.deliver`."""
    if attack is None:
        return False
    if attack.poison is not None:
        return True
    return not frozenset(attack.needs) and (method is None or method in node_attack_methods())


def attack_site(attack: Any, method: str) -> str:
    """Where a run of ``method`` applies ``attack``: ``"nodes"`` (the Byzantine
    ``ClientApp`` nodes, :func:`attack_on_node`), ``"strategy"`` (through
    :meth:`Federation.deliver` before aggregation) or ``"none"`` (no attack)."""
    if attack is None:
        return "none"
    return "nodes" if attack_on_node(attack, method) else "strategy"


def attack_report(runs: list[dict[str, Any]]) -> list[str]:
    """The lines ``robust-pfl flower`` prints for the ``attack_runs`` of its summary:
    per run, where its attack ran and, on the nodes, how many node replies carried the
    attack's rows (counted from the nodes' own word, so an attack whose rows look like
    a silent node's, NaN or zero, still counts as applied)."""
    lines = []
    for entry in runs:
        if entry["ran_on"] == "nodes":
            lines.append(f"  {entry['run']}: attack {entry['attack']!r} ran on the Byzantine nodes; "
                         f"{entry['node_replies_with_attack']} of their {entry['byzantine_node_replies']} replies "
                         "carried its rows")
        elif entry["ran_on"] == "strategy":
            lines.append(f"  {entry['run']}: attack {entry['attack']!r} ran in the strategy, before aggregation")
        else:
            lines.append(f"  {entry['run']}: no attack")
    return lines


# -- the server's view of the clients ----------------------------------------------------
#: ``(kind, requests) -> replies``: each request ``(client, models [M, d], sample
#: indices [b])``, each reply ``[M, d]`` (kind ``"gradient"``) or ``[M]`` (``"loss"``).
Exchange = Callable[[str, list[tuple[int, Tensor, Tensor]]], list[Tensor]]


@dataclass
class RemoteFederation(Federation):
    """A :class:`Federation` whose clients are remote nodes.

    It holds no data: ``train`` and every batch are index schedules
    (``Batch(inputs=[N, b] sample indices, targets=[N, b] client index)``, so that
    ``Batch.select`` keeps each row with its node, and a method that reads the full
    local data, as HypCluster's choice does, reads all indices), and every gradient or
    loss is asked of the nodes through ``exchange``.  ``param_dtype`` is the models'
    dtype (the simulator reads it off the data).  ``deliver`` is the simulator's: the strategy's attack (an
    omniscient one; ``None`` when the nodes attack themselves) replaces the Byzantine
    rows there.
    """

    exchange: Exchange | None = field(default=None, kw_only=True)
    param_dtype: torch.dtype = field(default=torch.float32, kw_only=True)

    @property
    def dtype(self) -> torch.dtype:
        return self.param_dtype

    def _ask(self, kind: str, models: Callable[[int], Tensor], batch: Batch) -> list[Tensor]:
        if self.exchange is None:
            raise RuntimeError("RemoteFederation needs an exchange (RobustStrategy sets it)")
        owners = batch.targets[:, 0].tolist()
        requests = [(client, models(row), batch.inputs[row]) for row, client in enumerate(owners)]
        self.sample_gradients += sum(m.shape[0] for _, m, _ in requests) * batch.inputs.shape[1]
        return self.exchange(kind, requests)

    def gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None, skip_unread: bool = False,
                  blend: float | None = None) -> Tensor:
        """``g_i(x_i)`` of every row's node; ``skip_unread`` is ignored (a Byzantine
        node's reply is what it sends)."""
        replies = self._ask("gradient", lambda row: params[row : row + 1], batch)
        grads = torch.cat(replies).to(params.dtype)
        if out is None:
            return grads
        if blend is not None:
            return out.lerp_(grads, blend)
        return out.copy_(grads)

    def cross_gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None) -> Tensor:
        """``g_j(x_m)``: each sender's node evaluates all ``M`` models, ``[M, S, d]``."""
        grads = torch.stack(self._ask("gradient", lambda row: params, batch), dim=1).to(params.dtype)
        return grads if out is None else out.copy_(grads)

    def cross_losses(self, params: Tensor, batch: Batch) -> Tensor:
        """``f_j(x_m)``: ``[M, S]``."""
        return torch.stack(self._ask("loss", lambda row: params, batch), dim=1).to(params.dtype)


def remote_federation(config: ExperimentConfig, task: Any, seed: int, exchange: Exchange | None,
                      method: str) -> RemoteFederation:
    """The server's federation for ``task`` in a run of ``method``: the simulator's
    ``build_federation`` without the data, and with the attack only when the strategy
    applies it."""
    parts = built(config)
    attack = parts.attack
    n_clients, n = task.train.inputs.shape[:2]
    schedule = ClientData(torch.arange(n).expand(n_clients, n).contiguous(),
                          torch.arange(n_clients).unsqueeze(1).expand(n_clients, n).contiguous())
    return RemoteFederation(
        objective=task.objective, train=schedule, cluster_ids=task.cluster_ids, byzantine=task.byzantine,
        seed=seed, batch_size=config.batch_size, attack=None if attack_on_node(attack, method) else attack,
        device=parts.device, num_classes=task.num_classes, exchange=exchange,
        param_dtype=task.train.inputs.dtype,
    )


# -- node failures --------------------------------------------------------------------------
class NodeError(RuntimeError):
    """Nodes that cannot take part in a run: they failed, or did not answer, the
    strategy's first (``hello``) exchange, where each node also imports the run's
    plug-ins and validates its config.  The run stops there: such a node would fail
    every request."""


@dataclass
class NodeFailures:
    """The requests one node failed in one run (a method and seed): an error reply
    (the ``ClientApp`` raised), no reply within ``timeout_s``, or a reply that is not
    one float vector of the requested shape.  Each became a NaN row, which every
    defense drops; ``count`` of them, the first in round ``first_round`` with
    ``first_message``."""

    client: int
    node: int
    byzantine: bool
    count: int
    first_round: int
    first_message: str


#: ANSI colour codes (Ray colours its error text).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


#: ``ValueError: message``: a traceback's line naming an exception and its message.
_RAISED = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt|Warning)\b[^:\s]*: \S")
#: The exceptions Flower and Ray wrap a node's own in.
_WRAPPERS = re.compile(r"^ray\.|ClientAppException")


def error_headline(reason: str) -> str:
    """The line of a node's error text that says what went wrong: Flower's reason for
    an exception in a ``ClientApp`` is Ray's whole traceback, the node's exception
    followed by the ``RayTaskError`` and ``ClientAppException`` wrapping it.  Returns
    the last line naming an exception that is not such a wrapper (``ValueError: ...``,
    with the indented lines that continue its message, as a :class:`ConfigError`'s
    fields, joined by spaces), else the text's last non-empty line; colour codes
    removed."""
    text = _ANSI.sub("", reason)
    wrapped = re.fullmatch(r"<class '[^']*'>:<'(.*)'>", text, flags=re.DOTALL)  # Flower's "<class 'T'>:<'text'>"
    lines = (wrapped.group(1) if wrapped else text).splitlines()
    named = [i for i, line in enumerate(lines) if _RAISED.match(line) and not _WRAPPERS.search(line.split(":")[0])]
    if not named:
        return next((line.strip() for line in reversed(lines) if line.strip()), "(no message)")
    end = named[-1] + 1
    while end < len(lines) and lines[end][:1].isspace() and lines[end].strip():
        end += 1
    return " ".join(line.strip() for line in lines[named[-1]:end])


def failure_report(failures: list[dict[str, Any]], attack: str) -> list[str]:
    """The lines ``robust-pfl flower`` prints for the ``node_failures`` of its summary
    (one per node and run), with what they did to the results: an honest node's
    failure drops an honest message, a Byzantine node's drops its attack's message
    (a silent node, weaker than the configured attack, since defenses drop NaN rows)
    or the honest vector the strategy's attack may read."""
    if not failures:
        return []
    honest = [f for f in failures if not f["byzantine"]]
    byzantine = [f for f in failures if f["byzantine"]]
    total = sum(f["count"] for f in failures)
    lines = [f"error: {total} request(s) to {len(failures)} Flower node(s) failed; each failed request became a NaN "
             "row, which the defenses drop (summary.json: node_failures):"]
    lines += [f"  {f['run']}: client {f['client']} ({'Byzantine' if f['byzantine'] else 'honest'}, node {f['node']}): "
              f"{f['count']} failed, the first in round {f['first_round']}: {f['first_message']}" for f in failures]
    if honest:
        lines.append("  honest nodes failed: their messages are missing from the aggregation, so the results are "
                     "not those of the config")
    if byzantine:
        lines.append(f"  Byzantine nodes failed: their rows (the attack's messages where {attack!r} runs on the "
                     "nodes, else the vectors the strategy's attack reads) are missing, so the run did not apply "
                     "the config's attack")
    return lines


# -- the strategy -------------------------------------------------------------------------
def _strategy_base() -> type:
    from flwr.serverapp.strategy import Strategy

    return Strategy


class RobustStrategy:
    """A Flower ``Strategy`` (built by :func:`make_strategy`) running one registered
    algorithm of :func:`supported_methods` over the nodes of a ``Grid``.

    It keeps every node's personalised model (the algorithm's ``client_models()``)
    and sends each node only the models it must evaluate.  ``node_of[i]`` maps client
    ``i`` to its Flower node id (learnt by a ``hello`` exchange)."""

    def __init__(self, method: Any, config: ExperimentConfig, seed: int, task: Any, timeout: float = 600.0) -> None:
        self.method, self.config, self.seed, self.timeout = method, config, seed, timeout
        self.federation = remote_federation(config, task, seed, self._exchange, method.name)
        attack = built(config).attack
        #: whether Byzantine nodes attack their replies themselves (not a data attack)
        self.nodes_attack = attack_on_node(attack, method.name) and attack.poison is None
        #: where the attack runs (:func:`attack_site`)
        self.attack_site = attack_site(attack, method.name)
        #: replies received from Byzantine nodes, and those of them that carried the
        #: attack's rows by the node's own word (its reply's ``attacked`` flag)
        self.byzantine_replies = 0
        self.attacked_replies = 0
        self.algorithm = defenses.build(method.name, self.federation, params=method_params(config, method))
        self.algorithm.snapshot_records = False
        self.grid: Grid | None = None
        self.node_of: dict[int, int] = {}
        self.round_index = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self._pending: list[tuple[int, Tensor, Tensor]] = []
        self._kind = "gradient"
        #: per client, the requests its node failed (each became a NaN row)
        self.failures: dict[int, NodeFailures] = {}

    # Flower's Strategy interface --------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        """One message per pending request of the algorithm's current exchange (its
        ``(client, models, sample indices)``; ``arrays`` is unused: each node gets its
        own models); ``config["kind"]`` says gradient or loss."""
        from flwr.app import ArrayRecord as Arrays, ConfigRecord as Configs, Message as Msg, RecordDict

        requests = self._pending
        messages = []
        for row, (client, models, index) in enumerate(requests):
            content = RecordDict({
                "models": Arrays({"x": _array(models)}),
                "config": Configs({"kind": str(config["kind"]), "round": server_round, "row": row,
                                   "seed": self.seed, "index": [int(i) for i in index.tolist()],
                                   "attack": self.nodes_attack}),
            })
            messages.append(Msg(content=content, dst_node_id=self.node_of[client], message_type=ACTION))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[list[Tensor], None]:
        """The replies' vectors in request order.  A reply is filed under the row its
        sender was asked for (Flower's ``src_node_id``, not the row the reply names),
        and a missing reply, a node's error, or a reply that is not a float array of
        the requested shape becomes a NaN row, which every defense drops as
        inadmissible: a node that fails or lies can neither overwrite another node's
        reply nor stop the round.  Each such row is counted against its node in
        :attr:`failures` (``robust-pfl flower`` reports them and exits 1), and a
        node's first failure is warned about at once."""
        requests = self._pending
        row_of = {self.node_of[client]: row for row, (client, _, _) in enumerate(requests)}
        shapes = [tuple(models.shape[:1]) if self._kind == "loss" else tuple(models.shape) for _, models, _ in requests]
        out: dict[int, Tensor] = {}
        reasons: dict[int, str] = {}
        for reply in replies:
            row = row_of.get(reply.metadata.src_node_id)
            if row is None or row in out:  # a node not asked, or a second reply: not this row's
                continue
            if reply.has_error():
                reasons[row] = error_headline(reply.error.reason)
                continue
            try:
                array = reply.content["reply"]["y"].numpy()
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                reasons[row] = f"a reply without its array ({type(error).__name__}: {error})"
                continue
            self.bytes_received += array.nbytes
            value = torch.from_numpy(array.copy())
            if tuple(value.shape) == shapes[row] and value.is_floating_point():
                out[row] = value
                self._count_attack(requests[row][0], reply)
            else:
                reasons[row] = f"a reply of shape {tuple(value.shape)} and dtype {value.dtype}, expected {shapes[row]}"
        for row in range(len(requests)):
            if row not in out:
                self._failed(requests[row][0], server_round,
                             reasons.get(row, f"no reply within timeout_s = {self.timeout:g} s"))
        nan = torch.tensor(math.nan, dtype=torch.float32)
        return [out[row] if row in out else nan.expand(shapes[row]).clone() for row in range(len(requests))], None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                           ) -> Iterable[Message]:
        """No federated evaluation: the run evaluates the personalised models on the
        nodes' test sets as the simulator does (:func:`run_flower`)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> None:
        return None

    def summary(self) -> None:
        """Nothing to log beyond the run's own progress."""

    def _count_attack(self, client: int, reply: Message) -> None:
        """Count a valid reply of ``client``'s node towards :attr:`byzantine_replies`
        and, when the node says its attack made it, :attr:`attacked_replies` (the rows
        alone cannot tell: an attack may send what a silent node's NaN row holds)."""
        if not bool(self.federation.byzantine[client]):
            return
        self.byzantine_replies += 1
        try:
            self.attacked_replies += bool(reply.content["config"]["attacked"])
        except (KeyError, TypeError):  # a reply without the flag: not the attack's by its word
            pass

    def attack_entry(self, run: str) -> dict[str, Any]:
        """This strategy's ``attack_runs`` entry of summary.json for the run named ``run``."""
        attack = self.config.attack.name
        entry: dict[str, Any] = {"run": run, "attack": attack, "ran_on": self.attack_site}
        if self.attack_site == "nodes":
            entry |= {"node_replies_with_attack": self.attacked_replies,
                      "byzantine_node_replies": self.byzantine_replies}
        return entry

    def _failed(self, client: int, round_index: int, message: str) -> None:
        """Count a failed request of ``client``'s node; warn at its first."""
        failure = self.failures.get(client)
        if failure is not None:
            failure.count += 1
            return
        byzantine = bool(self.federation.byzantine[client])
        self.failures[client] = NodeFailures(client, self.node_of[client], byzantine, 1, round_index, message)
        warnings.warn(f"round {round_index}: the node of client {client} ({'Byzantine' if byzantine else 'honest'}) "
                      f"failed: {message}; its rows are NaN, which the defenses drop (every failure is counted in "
                      "summary.json's node_failures)", RuntimeWarning, stacklevel=3)

    # the exchange the algorithm's federation calls --------------------------------------
    def _exchange(self, kind: str, requests: list[tuple[int, Tensor, Tensor]]) -> list[Tensor]:
        if self.grid is None:
            raise RuntimeError("RobustStrategy.start(grid) first")
        from flwr.app import ArrayRecord as Arrays, ConfigRecord as Configs

        self.bytes_sent += sum(m.numel() * m.element_size() for _, m, _ in requests)
        self._pending, self._kind = requests, kind
        messages = self.configure_train(self.round_index, Arrays(), Configs({"kind": kind}), self.grid)
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        return self.aggregate_train(self.round_index, replies)[0]

    def connect(self, grid: Grid) -> None:
        """Learn which node is which client (each node states its ``partition-id``)."""
        from flwr.app import ConfigRecord as Configs, Message as Msg, RecordDict

        self.grid = grid
        nodes = list(grid.get_node_ids())
        if len(nodes) != self.federation.clients:
            raise NodeError(f"the grid has {len(nodes)} nodes, the run {self.federation.clients} clients")
        hello = [Msg(content=RecordDict({"config": Configs({"kind": "hello", "row": 0, "seed": self.seed})}),
                     dst_node_id=node, message_type=ACTION) for node in nodes]
        errors, answered = [], set()
        for reply in grid.send_and_receive(hello, timeout=self.timeout):
            answered.add(reply.metadata.src_node_id)
            if reply.has_error():
                errors.append(f"node {reply.metadata.src_node_id}: {error_headline(reply.error.reason)}")
            else:
                self.node_of[int(reply.content["config"]["client"])] = reply.metadata.src_node_id
        errors += [f"node {node}: no reply within timeout_s = {self.timeout:g} s" for node in nodes
                   if node not in answered]
        if errors:
            raise NodeError("Flower nodes cannot run the config (they load its plug-ins and validate it when the "
                            "run starts):\n  " + "\n  ".join(errors))

    def start(self, grid: Grid, num_rounds: int,
              on_round: Callable[[int, Any], None] | None = None) -> Tensor:
        """Run ``num_rounds`` rounds of the algorithm over ``grid``; ``on_round(done,
        record)`` after each.  Returns every node's personalised model ``[N, d]``."""
        self.connect(grid)

        def before(round_index: int) -> None:
            self.round_index = round_index

        run_rounds(self.algorithm, num_rounds, before=before, after=on_round)
        return self.algorithm.client_models()


def make_strategy(method: Any, config: ExperimentConfig, seed: int, task: Any, timeout: float = 600.0) -> Any:
    """A :class:`RobustStrategy` that is also a ``flwr.serverapp.strategy.Strategy``
    (the class is made when flwr is importable, so this module imports without it)."""
    require_flwr()
    cls = type("FlowerRobustStrategy", (RobustStrategy, _strategy_base()), {})
    return cls(method, config, seed, task, timeout)


def _array(tensor: Tensor) -> Any:
    from flwr.app import Array

    return Array(np.ascontiguousarray(tensor.detach().cpu().numpy()))


# -- the nodes ----------------------------------------------------------------------------
#: Per actor process: the run's config (``node_config``), each seed's task, and each
#: node's state (``node_state``).
_CONFIGS: dict[str, ExperimentConfig] = {}
_TASKS: dict[tuple[str, int], Any] = {}
_NODES: dict[tuple[str, int, int], "NodeState"] = {}


def node_config(payload: dict[str, Any], key: str, plugins: tuple[PluginSource, ...] = ()) -> ExperimentConfig:
    """The run's config in a node's process (cached under ``key``, its JSON): the
    server's plug-ins imported first (``plugins``: their source text, as a grid's cells
    get theirs, :func:`robust_pfl.plugins.shipped_sources`), then ``payload`` (the
    server's validated config, dumped) parsed and validated again, which also imports
    every ``plugins`` entry and the installed entry points.

    Why the node rebuilds the config rather than receiving the server's object: that
    object holds what validation built (a plug-in's attack instance), whose class
    unpickles only where its module is already imported, and a node process (a Ray
    actor, or a ``SuperNode`` on another machine) has imported nothing of the run yet.
    The warnings of validation (costs, budgets) were the server's to give."""
    if key not in _CONFIGS:
        install_sources(plugins, "the Flower run (on a node)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _CONFIGS[key] = parse_and_validate(payload, "the Flower run (on a node)")
    return _CONFIGS[key]


def _node_task(config: ExperimentConfig, key: str, seed: int) -> Any:
    """The run's task for ``seed`` as a node builds it (in simulation every node builds
    the deal and keeps only its own row: the same data the simulator deals)."""
    if (key, seed) not in _TASKS:
        _TASKS.clear()
        _NODES.clear()  # their rows are views into the task just dropped
        _TASKS[(key, seed)] = build_task(config, seed)
    return _TASKS[(key, seed)]


@dataclass
class NodeState:
    """What one node holds: its data (poisoned if it runs a data attack), its
    objective, and when Byzantine its attack and generator."""

    client: int
    inputs: Tensor
    targets: Tensor
    objective: Any
    attack: Any
    generator: torch.Generator | None
    cluster: int


def node_state(config: ExperimentConfig, key: str, seed: int, client: int) -> NodeState:
    """Node ``client``'s state for ``seed`` (cached per actor process under ``key``,
    the config's JSON)."""
    if (key, seed, client) in _NODES:
        return _NODES[(key, seed, client)]
    task = _node_task(config, key, seed)
    inputs, targets = task.train.inputs[client], task.train.targets[client]
    byzantine = bool(task.byzantine[client])
    attack = built(config).attack if byzantine else None
    if attack is not None and not attack_on_node(attack):
        attack = None  # the strategy applies it
    if attack is not None and attack.poison is not None:
        targets = attack.poison(targets.clone(), task.num_classes).to(targets.dtype)
    generator = make_generator(seed, f"attack/node{client}") if attack is not None else None
    state = NodeState(client, inputs, targets, task.objective, attack, generator, int(task.cluster_ids[client]))
    _NODES[(key, seed, client)] = state
    return state


def carries_attack(state: NodeState, kind: str, attack: bool = True) -> bool:
    """Whether the node's reply to a ``kind`` request is its attack's: every reply of a
    node whose labels its data attack poisoned, and the gradients of a node whose
    attack acts on its vector, when ``attack`` (the strategy's request) says so."""
    if state.attack is None:
        return False
    return state.attack.poison is not None or (kind == "gradient" and attack)


def answer(state: NodeState, kind: str, models: Tensor, index: Tensor, round_index: int, attack: bool = True
           ) -> Tensor:
    """A node's reply: its gradient (``[M, d]``) or loss (``[M]``) at each of
    ``models`` on its samples ``index``, after its own attack when
    :func:`carries_attack` says it applies."""
    batch = Batch(state.inputs[index].unsqueeze(0), state.targets[index].unsqueeze(0))
    models = models.to(state.inputs.dtype)
    if kind == "loss":
        return state.objective.cross_losses(models, batch)[:, 0]
    grads = state.objective.cross_gradients(models, batch)  # [M, 1, d]
    if not carries_attack(state, kind, attack) or state.attack.poison is not None:
        return grads[:, 0]  # honest, or of the poisoned labels already
    context = AttackContext(round_index=round_index, kind="gradient", byzantine=torch.ones(1, dtype=torch.bool),
                            cluster_ids=torch.tensor([state.cluster]), generator=state.generator,
                            receivers=None, senders=None, defense_state={})
    return state.attack(grads, context)[:, 0].to(grads.dtype)


def make_client_app(config: ExperimentConfig) -> Any:
    """The ``ClientApp`` every node runs: it answers the strategy's requests with its
    own data (``partition-id`` of its node config is its client index).

    The app carries the config as plain data with the source text of its plug-ins
    (:func:`node_config`), so a node process imports the plug-ins the server imported
    before it builds its attack or task; it does so at the strategy's first (``hello``)
    request, so a node that cannot stops the run there (:class:`NodeError`).  Call it
    after the config is loaded (:func:`load_flower_config` imports the plug-ins)."""
    require_flwr()
    from flwr.app import ArrayRecord as Arrays, ConfigRecord as Configs, Context, Message as Msg, RecordDict
    from flwr.clientapp import ClientApp

    config_json = config.model_dump_json()
    payload = config.model_dump()
    plugins = shipped_sources(config.plugins)
    app = ClientApp()

    @app.query("robust_pfl")
    def robust_pfl_query(message: Msg, context: Context) -> Msg:
        torch.set_num_threads(1)
        settings = message.content["config"]
        client = int(context.node_config["partition-id"])
        node_run = node_config(payload, config_json, plugins)
        if settings["kind"] == "hello":
            return Msg(RecordDict({"config": Configs({"client": client, "row": 0})}), reply_to=message)
        state = node_state(node_run, config_json, int(settings["seed"]), client)
        models = torch.from_numpy(message.content["models"]["x"].numpy().copy())
        index = torch.tensor(list(settings["index"]), dtype=torch.long)
        kind, attack = str(settings["kind"]), bool(settings["attack"])
        reply = answer(state, kind, models, index, int(settings["round"]), attack)
        # the node's word that its attack made this reply: the server cannot tell from
        # the rows (an attack may send NaN, as a silent node's row is)
        content = RecordDict({"reply": Arrays({"y": _array(reply)}),
                              "config": Configs({"row": int(settings["row"]),
                                                 "attacked": carries_attack(state, kind, attack)})})
        return Msg(content, reply_to=message)

    return app


# -- a whole run ---------------------------------------------------------------------------
def run_flower(run: FlowerRun, out_dir: Path | None = None, verbose: bool = False) -> dict[str, Any]:
    """Every method × seed of ``run`` as one Flower simulation
    (``flwr.simulation.run_simulation``, one ``ClientApp`` node per client), evaluated
    and written as ``robust-pfl run`` writes (:func:`robust_pfl.engine.results.write_results`:
    ``summary.json`` and ``history.csv``), plus ``flower`` (the options and traffic)
    and ``node_failures`` in the summary: one entry per run and node that failed a
    request (:class:`NodeFailures` with the run's name), empty when none did; and
    ``attack_runs``: per run, its attack and where it ran (:func:`attack_site`), with,
    on the nodes, the Byzantine nodes' replies and those that carried the attack's
    rows (:meth:`RobustStrategy.attack_entry`; printed by :func:`attack_report`).  Raises
    :class:`NodeError` when nodes cannot start the run."""
    require_flwr()
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from robust_pfl.provenance import provenance
    from robust_pfl.engine.results import ResultTable, write_results

    config = run.config
    table = ResultTable()
    models: dict[tuple[str, int], Tensor] = {}
    traffic: dict[str, dict[str, int]] = {}
    failures: list[dict[str, Any]] = []
    attack_runs: list[dict[str, Any]] = []
    failure: list[BaseException] = []
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Any, context: Any) -> None:
        try:
            for seed in config.seeds:
                task = build_task(config, seed)
                evaluation = task.to(torch.device(config.device))
                for method in config.methods:
                    strategy = make_strategy(method, config, seed, task, run.options.timeout_s)
                    table.add(method.display, seed, 0, honest_means(evaluation, strategy.algorithm))

                    def on_round(done: int, record: Any, strategy: Any = strategy, method: Any = method,
                                 seed: int = seed, evaluation: Any = evaluation) -> None:
                        if done % config.eval_every == 0 or done == config.rounds:
                            table.add(method.display, seed, done, honest_means(evaluation, strategy.algorithm, record))

                    final = strategy.start(grid, config.rounds, on_round)
                    models[(method.display, seed)] = final.clone()
                    name = f"{method.display} seed={seed}"
                    traffic[name] = {"bytes_to_nodes": strategy.bytes_sent, "bytes_from_nodes": strategy.bytes_received}
                    failures.extend({"run": name, **asdict(lost)} for _, lost in sorted(strategy.failures.items()))
                    attack_runs.append(strategy.attack_entry(name))
        except BaseException as error:  # surfaced after the simulation returns
            failure.append(error)
            raise

    start = time.perf_counter()
    backend = {"client_resources": {"num_cpus": run.options.cpus_per_node, "num_gpus": 0.0}}
    try:
        run_simulation(server_app=server_app, client_app=make_client_app(config), num_supernodes=run.clients,
                       backend_config=backend, verbose_logging=verbose)
    except BaseException:
        if failure:  # the server's own error (a NodeError ...), not Flower's wrapping of it
            raise failure[0] from None
        raise
    if failure:
        raise failure[0]
    if len(models) != len(config.methods) * len(config.seeds):
        raise RuntimeError("the Flower simulation ended before every method and seed ran (see its log)")
    seconds = time.perf_counter() - start
    extra = {"config": config.model_dump(mode="json"), "flower": run.options.model_dump(mode="json") | {
             "traffic": traffic}, "node_failures": failures, "attack_runs": attack_runs,
             "provenance": provenance(config.device, torch.get_num_threads(), seconds)}
    summary = write_results(table, Path(out_dir), extra) if out_dir is not None else {"final": table.final(), **extra}
    summary["models"] = models  # not written: for callers (the equivalence test)
    return summary
