"""Core types shared by attacks, defenses and theory checks.

The core defines the *interfaces* (what an attack sees, what a round reports); the
packages ``attacks`` and ``defenses`` implement them and never import each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping

import torch
from torch import Tensor

MessageKind = Literal["gradient", "momentum", "cross_gradient", "model", "loss"]


@dataclass(frozen=True)
class AttackContext:
    """What an attacker may see when the federation collects one set of messages
    ``[..., S, d]`` from ``S`` senders (docs/extending.md, "Context and state reference").

    Attributes:
        round_index: the training round (0-based).
        kind: what the messages are (own gradients, momenta, FC's cross gradients,
            models, reported losses ``[S, K]``).
        byzantine: ``[S]`` bool mask of the Byzantine senders of this delivery.
        cluster_ids: ``[S]`` hidden cluster of every sender (an omniscient attacker
            may use it; Byzantine clients carry the cluster they were placed in).
        receivers: for messages ``[R, S, d]`` delivered to ``R`` clients apart (FC's
            cross gradients, PDL-TC's and FedSPD's neighbours), ``[R]``: the client
            that block ``r`` goes to; ``None``: one set for the server.
        senders: ``[S]`` global client index of every message row (FC's random
            subgroups deliver a subset of the clients); ``None`` means all clients in
            order.
        defense_state: what the defense publishes to adaptive attacks, as its
            ``published_state`` declares (:mod:`robust_pfl.engine.defense_state`: e.g.
            FC's ``centres`` ``[R, 1, d]``, MC's ``[K, d]``, ``None`` in round 0); empty
            for a defense that publishes nothing.
        generator: the attack's own seeded generator (independent of data sampling).
        memory: what an attack keeps from one call to the next within a run (a dict
            the federation owns, saved in its checkpoints: a resumed run sees what the
            uninterrupted one saw); keys are the attack's own, e.g. the optimised
            search's last value (:mod:`attacks.search`).  A caller without a run (a
            probe, a test) hands a fresh dict.
    """

    round_index: int
    kind: MessageKind
    byzantine: Tensor
    cluster_ids: Tensor
    generator: torch.Generator
    receivers: Tensor | None = None
    senders: Tensor | None = None
    defense_state: Mapping[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)


class AttackBase(ABC):
    """The base class of every attack: what the engine reads of one, each declared here
    with its default (a subclass overrides a class attribute, or a property where an
    option decides).  Subclass it as a frozen dataclass whose fields are the options.

    * ``name``, ``summary``: the registry key and one line for ``robust-pfl attacks``.
    * ``needs``: what it uses (``omniscient``: the honest messages; ``adaptive``: the
      defense's state; ``defense_aware``: it is built against one named defense;
      ``data``: it poisons training data).
    * ``reads_messages``: False when its rows depend on the message shapes and its
      random stream only (the engine then skips computing the Byzantine rows).
    * ``reads_own_rows``: False when it reads only the honest senders' rows.
    * ``iid_rows``: with ``reads_messages = False``, every row an independent draw (a
      caller that needs only some rows may draw those alone).
    * ``forges_losses``: it replaces loss reports (``"loss"`` messages) too; every other
      attack leaves them honest.
    * ``graph_placement``: where its Byzantine nodes sit on a graph (``"random"``, or
      ``"high_degree"``).
    * ``write_rows(rows, context)`` / ``write_from(messages, rows, context)``: optional
      fast paths writing the call's rows in place (``None``: absent).
    * ``poison(targets, num_classes)``: a data attack's label poisoning (``None``: none).
    * ``check_reported_models(models)``: a loss-forging attack's check, at load, of
      the number of models a method reports losses on.

    A backdoor (a trigger stamped on training and test images) subclasses
    :class:`BackdoorAttack`, which declares its hooks.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset()
    reads_messages: ClassVar[bool] = True
    reads_own_rows: ClassVar[bool] = True
    iid_rows: ClassVar[bool] = False
    forges_losses: ClassVar[bool] = False
    graph_placement: ClassVar[str] = "random"
    write_rows: ClassVar[Callable[..., None] | None] = None
    write_from: ClassVar[Callable[..., None] | None] = None
    poison: ClassVar[Callable[[Tensor, int], Tensor] | None] = None

    def check_reported_models(self, models: int) -> None:
        """Raise ``ValueError`` if the attack cannot forge loss reports on ``models``
        models (only attacks with ``forges_losses`` are asked; a run config is checked
        at load against every method's count).  Default: any count."""

    @abstractmethod
    def __call__(self, messages: Tensor, context: "AttackContext") -> Tensor:
        """The Byzantine rows of one delivery.

        Args:
            messages: ``[..., S, d]``, every sender's message as an honest client would
                have sent it (Byzantine senders' rows included; with
                ``reads_own_rows = False`` those rows may be anything).  Never modify it.
            context: the round, the Byzantine mask over the ``S`` senders, the clusters,
                a seeded generator and what an adaptive attack may see of the defense.

        Returns:
            ``[..., B, d]`` with ``B = context.byzantine.sum()``: the Byzantine rows in
            the order of ``context.byzantine.nonzero()``.  They may be anything, NaN
            and Inf included: defenses must cope.
        """


class BackdoorAttack(AttackBase):
    """The contract of a backdoor (BadNets, DBA, model replacement:
    :mod:`attacks.backdoor`): the engine stamps a trigger on the Byzantine clients'
    training images when it builds the federation, and on every test image to record
    the attack success rate.  The engine calls these hooks only on
    an instance of this class; a subclass implements:

    * ``target``: the class a triggered image should be classified as;
    * ``check_target(num_classes)``: raise ``ValueError`` naming ``<attack>.target``
      unless it is one of the task's classes (checked at load);
    * ``part_masks(height, width)``: ``[P, H, W]`` bool, the trigger part of each
      Byzantine client (client ``i`` stamps part ``i mod P``); raises ``ValueError``
      when the trigger does not fit the images (checked at load);
    * ``poison_samples(inputs, targets, num_classes, stats, generator)``: the Byzantine
      clients' ``[B, n, C, H, W]`` images and ``[B, n]`` labels after poisoning (new
      tensors), ``stats`` the task's ``(mean, std)`` normalisation or ``None``;
    * ``stamp_trigger(inputs, stats)``: ``inputs[..., C, H, W]`` with the full trigger
      on every image (a new tensor).
    """

    needs: ClassVar[frozenset[str]] = frozenset({"data"})
    target: int

    @abstractmethod
    def check_target(self, num_classes: int) -> None:
        """Raise ``ValueError`` naming ``<attack>.target`` unless ``target`` is one of
        ``num_classes`` classes."""

    @abstractmethod
    def part_masks(self, height: int, width: int) -> Tensor:
        """``[P, H, W]`` bool: the trigger part of each Byzantine client (``ValueError``
        when the trigger does not fit ``height x width`` images)."""

    @abstractmethod
    def poison_samples(self, inputs: Tensor, targets: Tensor, num_classes: int,
                       stats: tuple[Tensor, Tensor] | None, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The Byzantine clients' ``[B, n, C, H, W]`` images and ``[B, n]`` labels after
        poisoning (new tensors; a label is kept or set to ``target``)."""

    @abstractmethod
    def stamp_trigger(self, inputs: Tensor, stats: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``inputs[..., C, H, W]`` with the full trigger on every image (a new tensor)."""


def attack_forges_losses(attack: AttackBase | None) -> bool:
    """Whether ``attack`` replaces reported losses (messages of kind ``"loss"``, e.g.
    IFCA's and CLoVE's per-model losses): only attacks that declare
    ``forges_losses = True`` do; every other attack leaves loss reports honest, so a
    gradient attack means the same thing for every algorithm."""
    return attack is not None and attack.forges_losses


def attack_reads_messages(attack: AttackBase) -> bool:
    """Whether ``attack``'s output may depend on the values of the messages it is
    handed: ``True`` unless the attack declares ``reads_messages = False`` (its rows
    depend only on the shapes and its random stream)."""
    return bool(attack.reads_messages)


def attack_reads_own_rows(attack: AttackBase) -> bool:
    """Whether ``attack``'s output may depend on the Byzantine senders' own honest
    rows: ``False`` when it reads no message at all, or declares
    ``reads_own_rows = False`` (it reads only the honest senders' rows, e.g. bit flip
    of an honest client's gradient); ``True`` otherwise."""
    return attack_reads_messages(attack) and bool(attack.reads_own_rows)


def attack_draws_rows_apart(attack: AttackBase) -> bool:
    """Whether every row of ``attack`` is an independent draw (or one constant) that
    depends on nothing but its random stream: it reads no message and declares
    ``iid_rows = True``.  A caller that reads only some Byzantine rows (a graph
    system's Byzantine neighbours) may then have those alone drawn
    (:meth:`robust_pfl.engine.federation.Federation.deliver`'s ``needed``)."""
    return not attack_reads_messages(attack) and bool(attack.iid_rows)


@dataclass
class RoundRecord:
    """What one round of an algorithm exposes (for metrics and theory checks).

    Every tensor is optional; algorithms fill what they compute.  ``gradients`` and
    ``momenta`` are the honest per-client ``[N, d]`` values before any attack;
    ``updates`` are the vectors each client applied; ``assignment`` the cluster each
    client was assigned this round (``[N]``), if the algorithm forms clusters;
    ``reseeds`` how many rounds so far re-seeded the warm-started centres (MC's and
    Myopic-Clustering's ``reseed`` rule; ``None`` for methods without one).
    Records are snapshots unless the algorithm's ``snapshot_records`` was turned off
    (then tensors may be buffers the algorithm overwrites in its next step, and
    algorithms whose clients apply their cluster's vector leave ``updates`` out: it is
    ``cluster_updates[assignment]``, or ``centres[assignment]`` for those that send
    each client its cluster's centre).  When the
    attack reads no message (``reads_messages = False``) or only the honest senders'
    rows (``reads_own_rows = False``), engines skip the Byzantine clients' honest work:
    their rows of ``gradients``/``momenta`` are then not honest values (zeros, or what
    they sent).
    """

    round_index: int
    gradients: Tensor | None = None
    momenta: Tensor | None = None
    updates: Tensor | None = None
    centres: Tensor | None = None
    assignment: Tensor | None = None
    cluster_updates: Tensor | None = None  # [K, d]: the vector each cluster's clients applied
    reseeds: int | None = None  # server-clustering methods: times the centres were re-seeded so far in the run
    extras: dict[str, Any] = field(default_factory=dict)
