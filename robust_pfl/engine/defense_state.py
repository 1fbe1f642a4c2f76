"""What each defense shows adaptive attacks, declared: the keys of
``AttackContext.defense_state`` it publishes at each delivery, their shapes, when a
key is ``None``, and where a Byzantine row lands.

The declarations live in the engine because both sides read them and ``attacks``
never imports ``defenses``: every algorithm names the declaration it publishes
(``defenses.Algorithm.published_state``), ``defenses.check_algorithm`` checks that a
short run publishes exactly that, and ``attacks.check_attack`` calls an attack with
states made from every declaration here (round 0 included, where MC's centres are
still ``None``), so that an attack reading a key a defense does not publish fails in
its conformance test, named, and not in the middle of a run.  docs/extending.md's
"Context and state reference" is :func:`reference_markdown` of :data:`DECLARED`.

Shapes are written in symbols:

* ``N``: the federation's clients;
* ``S``: the senders of the delivery (``messages.shape[-2]``; ``N`` unless
  ``context.senders`` lists a subgroup, as FC's random subgroups do);
* ``R``: the receivers, ``context.receivers``: the delivered messages hold one
  leading block per receiver;
* ``d``: the model dimension;
* ``K``: the models or centres the defense holds (it may change between rounds:
  CFL splits clusters, CGPFL-Heur starts from one);
* ``...``: the leading dimensions of the messages a probe is handed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch
from torch import Tensor

from robust_pfl.engine.types import MessageKind

Dim = str | int
#: ``tensor``: a tensor of ``shape``; ``probe``: ``f(messages) -> shape`` (``...``: the
#: messages' leading dimensions), a pure function of what it is handed (it draws from
#: a copy of the defense's generator); ``radius_policy``: ``policy(dist[B, K, S], t) ->
#: tau[B, K]`` (:class:`defenses.RadiusPolicy`); ``client_gradient``: ``f(c) -> [d]``.
ValueKind = Literal["tensor", "probe", "radius_policy", "client_gradient"]
DType = Literal["float", "int", "bool"]


@dataclass(frozen=True)
class StateKey:
    """One key of ``defense_state``: what it holds and its shape in symbols."""

    name: str
    kind: ValueKind
    shape: tuple[Dim, ...]
    meaning: str
    dtype: DType = "float"
    #: an ``int`` tensor's values lie in ``[0, bound)``
    bound: str | None = None
    #: ``None`` in round 0 (nothing estimated yet), a value in every later round
    none_in_round_0: bool = False

    def shape_text(self) -> str:
        """The shape as the reference table writes it."""
        dims = f"[{', '.join(str(dim) for dim in self.shape)}]"
        text = {"tensor": dims, "probe": f"f(messages) -> {dims}", "client_gradient": f"f(c) -> {dims}",
                "radius_policy": "policy(dist[B, K, S], t) -> [B, K]"}[self.kind]
        if self.kind == "tensor" and self.dtype != "float":
            text += f" {self.dtype}"
        return text + (", None in round 0" if self.none_in_round_0 else "")


@dataclass(frozen=True)
class Delivery:
    """The deliveries of some message kinds: the messages' shape, the keys published
    with them and where a Byzantine row lands."""

    kinds: tuple[MessageKind, ...]
    messages: tuple[Dim, ...]
    keys: tuple[StateKey, ...]
    rows: str  # where the Byzantine rows of the delivery land
    receivers: bool = False  # context.receivers is set: one leading block per receiver
    senders: bool = False  # context.senders is set: the S senders are a subgroup of the N clients


@dataclass(frozen=True)
class PublishedState:
    """What one defense (or family, ``label``) publishes; a kind of message it
    delivers without a :class:`Delivery` here carries an empty state."""

    label: str
    deliveries: tuple[Delivery, ...] = ()

    def delivery(self, kind: str) -> Delivery | None:
        """The declaration covering deliveries of ``kind``, or None."""
        return next((item for item in self.deliveries if kind in item.kinds), None)


def _key(name: str, kind: ValueKind, shape: tuple[Dim, ...], meaning: str, **more: Any) -> StateKey:
    return StateKey(name, kind, shape, meaning, **more)


# -- the keys several defenses share ---------------------------------------------------------
_POLICY = _key("radius_policy", "radius_policy", (), "the threshold radius rule of the defense's clustering")
_MODELS = _key("models", "tensor", ("K", "d"), "the cluster models (before this round's update)")
_ASSIGNMENT = _key("assignment", "tensor", ("N",), "the model each client is assigned (last round's choice)",
                   dtype="int", bound="K")
_PER_CLIENT_PROBE = _key("aggregate", "probe", ("...", "S", "d"),
                         "per sender, what its cluster's server rule makes of candidate messages")

#: Publishes nothing (Local; the default of an algorithm of one's own).
NOTHING = PublishedState("local")

AGGREGATE = PublishedState("global, fltrust, foolsgold, ditto, knn_per", (
    Delivery(("gradient",), ("S", "d"), (
        _key("aggregate", "probe", ("...", 1, "d"),
             "the server's aggregate of candidate messages (Global, FLTrust, FoolsGold: its robust rule on a copy of "
             "its stream; Ditto, KNN-Per: the FedAvg mean)"),),
        "one set for the server: every admissible row may move the one global model"),
))

GROUND_TRUTH = PublishedState("ground_truth", (
    Delivery(("gradient",), ("S", "d"), (
        _key("aggregate", "probe", ("...", "S", "d"),
             "per sender, the mean of its true cluster's rows (Byzantine rows left out with exclude_byzantine)"),),
        "left out with exclude_byzantine (the default); otherwise averaged into the model of the true cluster "
        "its client was placed in (context.cluster_ids)"),
))

CFL = PublishedState("cfl", (
    Delivery(("gradient", "model"), ("S", "d"), (
        _key("models", "tensor", ("K", "d"), "the cluster models, K the clusters split so far"),
        _key("assignment", "tensor", ("N",), "each client's cluster", dtype="int", bound="K"),
        _PER_CLIENT_PROBE),
        "the row of client i is averaged into models[assignment[i]] (kind model: local models, "
        "turned into pseudo-gradients), and may split that cluster"),
))

CGPFL = PublishedState("cgpfl, cgpfl_heur", (
    Delivery(("model",), ("S", "d"), (
        _key("models", "tensor", ("K", "d"), "the cluster models (CGPFL-Heur starts from one)"),
        _key("assignment", "tensor", ("N",), "each client's cluster (last round's k-means)", dtype="int", bound="K"),
        _key("aggregate", "probe", ("...", "S", "d"),
             "per sender, the model its cluster gets when the server k-means-clusters candidate uploads")),
        "uploads are k-means-clustered by the server: a Byzantine row joins the cluster it falls in and moves "
        "that cluster's model"),
))

FC = PublishedState("fc", (
    Delivery(("cross_gradient",), ("R", "S", "d"), (
        _key("centres", "tensor", ("R", 1, "d"),
             "each receiver's starting centre: its own gradient g_r(x_r), the ball's centre"),
        _POLICY,
        _key("aggregate", "probe", ("...", 1, "d"),
             "each receiver's centre after Threshold-Clustering of candidate messages [R, S, d]"),
        _key("client_gradient", "client_gradient", ("d",),
             "client c's gradient at its own model on this round's batch (an honest client's for a Byzantine c)")),
        "block r goes to receiver receivers[r] alone, every row evaluated at x_r: the Byzantine rows of block r "
        "enter only receiver r's ball, centred at centres[r, 0]; senders lists the subgroup's global clients",
        receivers=True, senders=True),
))

SERVER_CLUSTERING = PublishedState("mc, myopic, pfl_tc", (
    Delivery(("momentum", "gradient"), ("S", "d"), (
        _key("centres", "tensor", ("K", "d"), "last round's centres (warm start)", none_in_round_0=True),
        _POLICY,
        _key("aggregate", "probe", ("...", "S", "d"),
             "what every client would apply: centres[assignment] after clustering candidate messages")),
        "one set clustered by the server against all K centres: a Byzantine row counts for the centres whose "
        "balls it falls in (MC, PFL-TC: momenta; Myopic: gradients)"),
))

_LOSS_REPORTS = Delivery(("loss",), ("S", "K"), (
    _MODELS, _ASSIGNMENT,
    _key("aggregate", "probe", ("...", "S", "K"), "the per-client cluster mean, here of the reports")),
    "reported losses (only a loss-forging attack replaces them): the lowest finite entry of a row picks its "
    "client's model")

IFCA = PublishedState("ifca, ifca_model_avg, hypcluster", (
    _LOSS_REPORTS,
    Delivery(("gradient", "model"), ("S", "d"), (_MODELS, _ASSIGNMENT, _PER_CLIENT_PROBE),
             "the row of client i is averaged into models[assignment[i]] (IFCA: gradients; IFCA model "
             "averaging, HypCluster: local models)"),
))

CLOVE = PublishedState("clove", (
    Delivery(("loss",), ("S", "K"), (
        _MODELS, _ASSIGNMENT,
        _key("assign", "probe", ("...", "S"), "the assignment the server would make from candidate reports",
             dtype="int", bound="K")),
        "reported losses, embedded and clustered: a forged row can change its client's cluster and the "
        "matching of clusters to models"),
    Delivery(("model", "gradient"), ("S", "d"), (_MODELS, _ASSIGNMENT, _PER_CLIENT_PROBE),
             "the row of client i is averaged into models[assignment[i]]"),
))

PDL_TC = PublishedState("pdl_tc", (
    Delivery(("momentum",), ("R", "S", "d"), (
        _key("centres", "tensor", ("R", 1, "d"), "each receiver's own momentum, its ball's centre"),
        _POLICY,
        _key("neighbours", "tensor", ("R", "N"), "each receiver's closed neighbourhood", dtype="bool"),
        _key("aggregate", "probe", ("...", 1, "d"),
             "each receiver's centre after clustering candidate messages [R, S, d]")),
        "block r goes to receiver receivers[r]: a Byzantine row of block r reaches it only where "
        "neighbours[r, sender]", receivers=True),
))

FEDSPD = PublishedState("fedspd", (
    Delivery(("model",), ("R", "S", "d"), (
        _key("centres", "tensor", ("R", "K", "d"), "the K centres each receiver holds (a view of all_centres)"),
        _key("selected", "tensor", ("N",), "the cluster each client trained this round", dtype="int", bound="K"),
        _key("mixture_weights", "tensor", ("N", "K"), "each client's mixture over the clusters"),
        _key("adjacency", "tensor", ("N", "N"), "this round's graph", dtype="bool"),
        _key("aggregate", "probe", ("...", 1, "d"),
             "the centre each receiver would hold for the cluster it trained, from candidate messages"),
        _key("all_centres", "tensor", ("K", "N", "d"), "every client's K centres"),
        _key("neighbours", "tensor", ("R", "N"), "each receiver's closed neighbourhood", dtype="bool")),
        "block r goes to receiver receivers[r]: a Byzantine row reaches it only where neighbours[r, sender], "
        "and is mixed into the receiver's centre of the cluster the sender trained (selected)",
        receivers=True),
))

#: Every built-in declaration, in the reference's order.
DECLARED: tuple[PublishedState, ...] = (NOTHING, AGGREGATE, GROUND_TRUTH, CFL, CGPFL, FC, SERVER_CLUSTERING, IFCA,
                                        CLOVE, PDL_TC, FEDSPD)


# -- checking a published state against its declaration ---------------------------------------
def _dtype_ok(value: Tensor, dtype: DType) -> bool:
    if dtype == "bool":
        return value.dtype == torch.bool
    if dtype == "int":
        return not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
    return value.is_floating_point()


class _Shapes:
    """Binds the symbols of a delivery; a free symbol (``K``) binds on first use."""

    def __init__(self, bound: Mapping[str, int], lead: tuple[int, ...]) -> None:
        self.bound, self.lead = dict(bound), lead

    def matches(self, declared: tuple[Dim, ...], actual: tuple[int, ...]) -> bool:
        expected: list[Dim] = []
        for dim in declared:
            expected.extend(self.lead if dim == "..." else [dim])
        if len(expected) != len(actual):
            return False
        for dim, size in zip(expected, actual):
            if isinstance(dim, int):
                if dim != size:
                    return False
            elif self.bound.setdefault(dim, size) != size:
                return False
        return True


def state_problems(declared: PublishedState, kind: str, round_index: int, messages: Tensor,
                   state: Mapping[str, Any], clients: int, dim: int, receivers: Tensor | None = None,
                   senders: Tensor | None = None) -> list[str]:
    """What in one delivery's ``state`` breaks ``declared``: an undeclared or missing
    key, a shape, dtype or bound off, a ``None`` where none is declared.  Probes are
    called on ``messages``, a radius policy on distances, ``client_gradient`` on 0.
    The empty list when it holds."""
    delivery = declared.delivery(kind)
    if delivery is None:
        return [f"publishes {sorted(state)} at {kind} deliveries, which it declares none at"] if state else []
    problems = []
    names = [key.name for key in delivery.keys]
    if set(state) != set(names):
        return [f"publishes {sorted(state)} at {kind} deliveries, declares {sorted(names)}"]
    if delivery.receivers != (receivers is not None) or delivery.senders != (senders is not None):
        problems.append(f"{kind}: receivers / senders set ({receivers is not None} / {senders is not None}), "
                        f"declared ({delivery.receivers} / {delivery.senders})")
    bound = {"N": clients, "d": dim, "S": messages.shape[-2]}
    if receivers is not None:
        bound["R"] = receivers.numel()
    shapes = _Shapes(bound, tuple(messages.shape[:-2]))
    if not shapes.matches(delivery.messages, tuple(messages.shape)):
        problems.append(f"{kind}: messages {tuple(messages.shape)}, declared {list(delivery.messages)}")
    for key in delivery.keys:
        value, where = state[key.name], f"{kind} round {round_index}: {key.name}"
        if value is None:
            if not (key.none_in_round_0 and round_index == 0):
                problems.append(f"{where} is None")
            continue
        if key.none_in_round_0 and round_index == 0:
            problems.append(f"{where} is declared None in round 0, got a value")
        if key.kind == "radius_policy":
            out = value(torch.ones(1, 1, messages.shape[-2], dtype=messages.dtype, device=messages.device),
                        round_index) if callable(value) else None
            if not isinstance(out, Tensor) or tuple(out.shape) != (1, 1):
                problems.append(f"{where}: not a policy(dist[B, K, S], t) -> [B, K]")
            continue
        if key.kind in ("probe", "client_gradient"):
            if not callable(value):
                problems.append(f"{where}: not callable")
                continue
            value = value(messages) if key.kind == "probe" else value(0)
        if not isinstance(value, Tensor):
            problems.append(f"{where}: {type(value).__name__}, not a tensor")
        elif not shapes.matches(key.shape, tuple(value.shape)):
            problems.append(f"{where}: shape {tuple(value.shape)}, declared {key.shape_text()}")
        elif not _dtype_ok(value, key.dtype):
            problems.append(f"{where}: dtype {value.dtype}, declared {key.dtype}")
        elif key.bound is not None and value.numel() and not (
                0 <= int(value.min()) and int(value.max()) < shapes.bound.get(key.bound, 0)):
            problems.append(f"{where}: values outside [0, {key.bound})")
    return problems


# -- example states, for an attack's conformance checks ---------------------------------------
@dataclass(frozen=True)
class MedianRadius:
    """An example radius policy: the median distance of every centre's points."""

    strict: bool = False
    undecided: Callable[[Tensor, Tensor], Tensor] | None = field(default=None)

    def __call__(self, distances: Tensor, round_index: int) -> Tensor:
        return torch.nan_to_num(distances, nan=0.0, posinf=0.0).median(dim=-1).values


def example_state(delivery: Delivery, round_index: int, sizes: Mapping[str, int], dtype: torch.dtype,
                  generator: torch.Generator) -> dict[str, Any]:
    """A state of ``delivery``'s keys and declared shapes (``sizes`` binds the
    symbols), seeded: random tensors, probes returning the admissible mean of what
    they are handed, ``None`` where the declaration has it in round 0."""
    state: dict[str, Any] = {}
    for key in delivery.keys:
        shape = tuple(dim if isinstance(dim, int) else sizes[dim] for dim in key.shape if dim != "...")
        if key.none_in_round_0 and round_index == 0:
            state[key.name] = None
        elif key.kind == "radius_policy":
            state[key.name] = MedianRadius()
        elif key.kind == "client_gradient":
            row = torch.randn(shape, generator=generator, dtype=dtype)
            state[key.name] = lambda client, row=row: row.clone()
        elif key.kind == "probe":
            state[key.name] = _example_probe(key)
        elif key.dtype == "int":
            state[key.name] = torch.randint(0, sizes[key.bound or "K"], shape, generator=generator)
        elif key.dtype == "bool":
            state[key.name] = torch.rand(shape, generator=generator) < 0.75
        else:
            state[key.name] = torch.randn(shape, generator=generator, dtype=dtype)
    return state


def _example_probe(key: StateKey) -> Callable[[Tensor], Tensor]:
    def probe(messages: Tensor) -> Tensor:
        lead = tuple(messages.shape[:-2])
        shape: list[int] = []
        for dim in key.shape:
            shape.extend(lead if dim == "..." else [dim if isinstance(dim, int) else
                                                    messages.shape[-2] if dim == "S" else messages.shape[-1]])
        if key.dtype != "float":
            return torch.zeros(shape, dtype=torch.long if key.dtype == "int" else torch.bool, device=messages.device)
        finite = torch.isfinite(messages).all(-1, keepdim=True)
        clean = torch.where(finite, messages, torch.zeros_like(messages))
        mean = clean.sum(-2, keepdim=True) / finite.sum(-2, keepdim=True).clamp_min(1).to(messages.dtype)
        return mean.expand(shape).clone()

    return probe


# -- the reference table ----------------------------------------------------------------------
def reference_markdown(declared: tuple[PublishedState, ...] = DECLARED) -> str:
    """docs/extending.md's per-defense reference: one table per declaration."""
    parts = []
    for item in declared:
        parts.append(f"#### `{item.label}`\n")
        if not item.deliveries:
            parts.append("Publishes nothing: `defense_state` is empty.\n")
        for delivery in item.deliveries:
            extra = [name for name, on in (("receivers", delivery.receivers), ("senders", delivery.senders)) if on]
            given = f"; `{'`, `'.join(extra)}` set" if extra else ""
            kinds = ", ".join(f"`{kind}`" for kind in delivery.kinds)
            dims = ", ".join(str(dim) for dim in delivery.messages)
            parts.append(f"{kinds} messages `[{dims}]`{given}. Byzantine rows: {delivery.rows}.\n")
            parts.append("| key | shape | holds |\n|---|---|---|")
            parts.extend(f"| `{key.name}` | `{key.shape_text()}` | {key.meaning} |" for key in delivery.keys)
            parts.append("")
    return "\n".join(parts).rstrip() + "\n"
