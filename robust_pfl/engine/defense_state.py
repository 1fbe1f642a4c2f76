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

Shapes are written in symbols, each with one meaning:

* ``N``: the federation's clients;
* ``S``: the senders of the delivery (``messages.shape[-2]``; ``N`` unless
  ``context.senders`` lists a subgroup, as FC's random subgroups do);
* ``R``: the receivers, ``context.receivers``: the delivered messages hold one
  leading block per receiver;
* ``B``: the Byzantine senders of the delivery, ``context.byzantine.sum()``;
* ``d``: the model dimension;
* ``K``: the models or centres the defense holds (it may change between rounds:
  CFL splits clusters, CGPFL-Heur starts from one);
* ``...``: the leading dimensions of the messages a probe is handed.

A radius policy is ``policy(dist[P, K, Q], l) -> tau[P, K]`` (:data:`POLICY_SIGNATURE`):

* ``P``: the clustering problems of one call, each clustered on its own (FC and
  PDL-TC: one per receiver clustered in that call, a chunk of the round's receivers;
  MC, Myopic, PFL-TC: 1); a policy must give each problem the radius it would give it
  alone;
* ``Q``: the points of each problem, the delivered rows the defense clusters;
* ``l``: Threshold-Clustering's iteration (Werner et al., Alg. 3), ``0 .. M - 1`` with
  ``M = clustering_rounds``; not the training round.  No built-in policy reads it.

At iteration ``l``, ``dist[p, k, q]`` is the distance of centre ``k`` (as it stands
before that iteration's move; ``l = 0``: the starting centre) to point ``q``, ``inf``
for an inadmissible point (non-finite, or its squared norm overflows); every delivered row counts, the Byzantine
rows as the attack returned them.  With the ``gram`` and ``pairwise`` evaluations the
policy is also handed lower and upper bounds of the distances (to find the points
whose exact distance decides a membership), and distances whose membership is
decided either way are exact only up to rounding.  Which rows each defense's
problems hold, and when, is in its ``radius_policy`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch
from torch import Tensor

from robust_pfl.engine.types import MessageKind

Dim = str | int
#: How the reference writes a radius policy (the symbols: the module docstring).
POLICY_SIGNATURE = "policy(dist[P, K, Q], l) -> tau[P, K]"

#: ``tensor``: a tensor of ``shape``; ``probe``: ``f(messages) -> shape`` (``...``: the
#: messages' leading dimensions), a pure function of what it is handed (it draws from
#: a copy of the defense's generator); ``radius_policy``: :data:`POLICY_SIGNATURE`
#: (:class:`defenses.RadiusPolicy`); ``client_gradient``: ``f(c) -> [d]``.
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
    #: an ``int`` tensor's values lie in ``[lowest, bound)``: ``bound`` a symbol or a size
    bound: str | int | None = None
    #: the least value of an ``int`` tensor (-1 where it marks "no centre")
    lowest: int = 0
    #: ``None`` in round 0 (nothing estimated yet), a value in every later round
    none_in_round_0: bool = False

    def shape_text(self) -> str:
        """The shape as the reference table writes it."""
        dims = f"[{', '.join(str(dim) for dim in self.shape)}]"
        text = {"tensor": dims, "probe": f"f(messages) -> {dims}", "client_gradient": f"f(c) -> {dims}",
                "radius_policy": POLICY_SIGNATURE}[self.kind]
        if self.kind == "tensor" and self.dtype != "float":
            text += f" {self.dtype}"
            if self.bound is not None:
                text += f" in [{self.lowest}, {self.bound})"
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
def _policy(fed: str) -> StateKey:
    """The radius rule of a Threshold-Clustering defense; ``fed``: which problems and
    rows it is handed, and when."""
    return _key("radius_policy", "radius_policy", (),
                "the radius rule of the defense's Threshold-Clustering (Alg. 3), called at each iteration l = 0 .. "
                f"M - 1 of this round's clustering, after this delivery: {fed}")


_MODELS = _key("models", "tensor", ("K", "d"), "the cluster models (before this round's update)")
#: At the loss reports, before this round's choice.
_ASSIGNMENT_BEFORE = _key(
    "assignment", "tensor", ("N",),
    "last round's choice: client i (Byzantine rows included) was on models[assignment[i]]; all 0 in round 0",
    dtype="int", bound="K")
#: At the messages sent after the choice.
_ASSIGNMENT_CHOSEN = _key(
    "assignment", "tensor", ("N",),
    "this round's choice, made from the reported losses (a Byzantine client's from its report, forged or not): "
    "client i's row is computed at and averaged into models[assignment[i]]", dtype="int", bound="K")
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
        _key("assignment", "tensor", ("N",),
             "each client's cluster (Byzantine rows included) after last round's splits, before this round's: "
             "client i's row is computed at models[assignment[i]]; all 0 in round 0", dtype="int", bound="K"),
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
        _policy("P receivers of this delivery's chunk (on an accelerator, the receivers of every group of one "
                "size gathered), K = 1; receiver r's Q = S points are block r as delivered (its subgroup's rows, "
                "the Byzantine rows the attack returned for r); l = 0 measures from centres[r, 0]; with "
                "record_balls once more at l = M - 1 on the final centres"),
        _key("assignment", "tensor", ("R", "N"),
             "last round's balls: assignment[r, j] = 0 when client j's row (Byzantine or honest) was inside "
             "receiver receivers[r]'s ball, its one centre, at the last iteration of last round's clustering; -1 "
             "when it was outside or not in r's subgroup", dtype="int", bound=1, lowest=-1, none_in_round_0=True),
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
        _key("centres", "tensor", ("K", "d"),
             "last round's final centres: this round's starting centres with warm_start (MC's default; Myopic and "
             "PFL-TC seed afresh by default)", none_in_round_0=True),
        _policy("P = 1, the K current centres against all Q = N delivered rows (the Byzantine rows as the attack "
                "returned them; l = 0: the starting centres); with reseed = merged again from fresh seeds when "
                "the centres merged, with reseed = challenger also a fresh clustering of a density sample of Q <= "
                "128 admissible rows; with record_balls once more at l = M - 1 on the final centres"),
        _key("assignment", "tensor", ("N",),
             "last round's assignment: client i (Byzantine rows included, by the row delivered for it) applied "
             "centres[assignment[i]], the centre its row was nearest to after the last iteration of last round's "
             "clustering (switch_margin > 0: its previous centre unless the nearest was under (1 - switch_margin) times as far); with "
             "centre_update = cell it fixes this round's cells", dtype="int", bound="K", none_in_round_0=True),
        _key("aggregate", "probe", ("...", "S", "d"),
             "what every client would apply: centres[assignment] after clustering candidate messages")),
        "one set clustered by the server against all K centres: a Byzantine row counts for the centres whose "
        "balls it falls in (MC, PFL-TC: momenta; Myopic: gradients)"),
))

_LOSS_REPORTS = Delivery(("loss",), ("S", "K"), (
    _MODELS, _ASSIGNMENT_BEFORE,
    _key("aggregate", "probe", ("...", "S", "K"), "the per-client cluster mean, here of the reports")),
    "reported losses (only a loss-forging attack replaces them): the lowest finite entry of a row picks its "
    "client's model")

IFCA = PublishedState("ifca, ifca_model_avg, hypcluster", (
    _LOSS_REPORTS,
    Delivery(("gradient", "model"), ("S", "d"), (_MODELS, _ASSIGNMENT_CHOSEN, _PER_CLIENT_PROBE),
             "the row of client i is averaged into models[assignment[i]] (IFCA: gradients; IFCA model "
             "averaging, HypCluster: local models)"),
))

CLOVE = PublishedState("clove", (
    Delivery(("loss",), ("S", "K"), (
        _MODELS, _ASSIGNMENT_BEFORE,
        _key("assign", "probe", ("...", "S"), "the assignment the server would make from candidate reports",
             dtype="int", bound="K")),
        "reported losses, embedded and clustered: a forged row can change its client's cluster and the "
        "matching of clusters to models"),
    Delivery(("model", "gradient"), ("S", "d"), (_MODELS, _ASSIGNMENT_CHOSEN, _PER_CLIENT_PROBE),
             "the row of client i is averaged into models[assignment[i]]"),
))

PDL_TC = PublishedState("pdl_tc", (
    Delivery(("momentum",), ("R", "S", "d"), (
        _key("centres", "tensor", ("R", 1, "d"), "each receiver's own momentum, its ball's centre"),
        _policy("P receivers of this delivery's chunk, K = 1; complete graph: receiver r's Q = N points are block "
                "r as delivered (the Byzantine rows the attack returned for r); sparse graph: its closed "
                "neighbourhood's rows only (a quantile radius is taken over them by the defense without calling "
                "the policy; a fixed or theory one is handed them padded with inf to the largest neighbourhood); "
                "l = 0 measures from centres[r, 0]"),
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


def _size(dim: Dim, bound: Mapping[str, int]) -> int:
    """A dimension's size: a number as it is, a symbol as ``bound`` binds it (0 when
    unbound, so that no value lies below it)."""
    return dim if isinstance(dim, int) else bound.get(dim, 0)


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
        missing, extra = sorted(set(names) - set(state)), sorted(set(state) - set(names))
        return [f"publishes {sorted(state)} at {kind} deliveries, declares {sorted(names)} (declared, not "
                f"published: {missing}; published, not declared: {extra})"]
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
            # one problem, one centre, the delivery's senders as points, at iteration 0
            out = value(torch.ones(1, 1, messages.shape[-2], dtype=messages.dtype, device=messages.device),
                        0) if callable(value) else None
            if not isinstance(out, Tensor) or tuple(out.shape) != (1, 1):
                problems.append(f"{where}: not a {POLICY_SIGNATURE}")
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
                key.lowest <= int(value.min()) and int(value.max()) < _size(key.bound, shapes.bound)):
            problems.append(f"{where}: values outside [{key.lowest}, {key.bound})")
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
            state[key.name] = torch.randint(key.lowest, _size(key.bound or "K", sizes), shape, generator=generator)
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
