"""The simulated federation: N clients with hidden clusters, stacked data, a Byzantine
mask, seeded streams, and the one place where attacks inject.

Everything an algorithm needs from "the clients" goes through :class:`Federation`:

* ``sample_batch()``: one seeded batch per client (one gather, no client loop);
* ``gradients(params, batch)``: honest ``g_i(x_i)`` for all clients at once;
* ``cross_gradients(params_rows, batch)``: ``g_j(x_m)`` for a chunk of models ``m``;
* ``deliver(messages, context)``: **the injection point**: the attack replaces the
  Byzantine rows of any message set before the algorithm aggregates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import Tensor

from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.devices import same_device
from robust_pfl.engine.objectives import Objective
from robust_pfl.engine.seeding import generator as make_generator
from robust_pfl.engine.types import (
    BackdoorAttack,
    AttackBase,
    AttackContext,
    MessageKind,
    attack_draws_rows_apart,
    attack_forges_losses,
    attack_reads_messages,
    attack_reads_own_rows,
)


@dataclass
class Federation:
    """A federation of ``N`` clients (honest and Byzantine).

    Attributes:
        objective: the loss every client minimises on its own data.
        train: stacked client data ``[N, n, ...]``.
        cluster_ids: ``[N]`` hidden cluster index of each client (Byzantine clients
            carry the cluster they were placed in).
        byzantine: ``[N]`` bool mask.
        seed: the run's seed; streams derive from it.
        batch_size: samples per client per round (``None``: full local data).
        attack: the attack, or ``None``.  A data attack (one with a ``poison``
            method, e.g. label flipping) rewrites the Byzantine clients' training
            targets once, here; they then send honest gradients of poisoned data.
        device: where tensors live.
        num_classes: classes of a classification task (needed by data attacks).
        pixel_stats: ``(mean, std)``, each ``[C, 1, 1]``, of an image task's
            normalisation (``inputs = (pixels - mean) / std``): a backdoor attack
            stamps its pixel-space trigger through it (``None``: inputs are pixels).
        sample_gradients: how many per-sample gradient (or loss) evaluations the
            federation's clients have made so far: a model on one sample counts 1.  A
            measure of a run's work that is the same on every machine (the ``[theory]``
            budget reads it).
    """

    objective: Objective
    train: ClientData
    cluster_ids: Tensor
    byzantine: Tensor
    seed: int = 0
    batch_size: int | None = None
    attack: AttackBase | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    num_classes: int | None = None
    pixel_stats: tuple[Tensor, Tensor] | None = None
    sample_gradients: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.attack is not None and not isinstance(self.attack, AttackBase):
            raise TypeError(
                f"an attack must subclass robust_pfl.engine.types.AttackBase (attacks.AttackBase), which declares what "
                f"the engine reads of it; got {type(self.attack).__name__}"
            )
        n = self.train.inputs.shape[0]
        if self.cluster_ids.shape != (n,) or self.byzantine.shape != (n,):
            raise ValueError(
                f"cluster_ids and byzantine must have shape ({n},), got "
                f"{tuple(self.cluster_ids.shape)} and {tuple(self.byzantine.shape)}"
            )
        self.device = torch.device(self.device)
        self.train = self._received(self.train)
        self.cluster_ids = self.cluster_ids.to(self.device).long()
        self.byzantine = self.byzantine.to(self.device).bool()
        self._batch_rng = make_generator(self.seed, "batches", self.device)
        self._attack_rng = make_generator(self.seed, "attack", self.device)
        self._attack_memory: dict[str, Any] = {}  # AttackContext.memory: checkpointed with the federation
        self._batch_buffer: Batch | None = None
        self._host_mask: tuple[Tensor, int, MaskFacts] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_host_mask", None)  # a checkpoint written before the mask facts
        self.__dict__.setdefault("_attack_memory", {})  # and before attacks kept a memory

    def redeal(self, train: ClientData) -> None:
        """Replace every client's training data (same shapes), e.g. the official code's
        per-epoch re-dealing of MNIST; a data attack poisons the new data too."""
        if train.inputs.shape != self.train.inputs.shape or train.targets.shape != self.train.targets.shape:
            raise ValueError(
                f"redeal needs data of the same shapes: {tuple(self.train.inputs.shape)} / "
                f"{tuple(self.train.targets.shape)}, got {tuple(train.inputs.shape)} / {tuple(train.targets.shape)}"
            )
        self.train = self._received(train)

    def _received(self, train: ClientData) -> ClientData:
        """``train`` on this federation's device, after any data attack."""
        targets = self._poisoned_targets(train.targets)
        inputs, targets = self._backdoored(train.inputs, targets)
        return ClientData(inputs.to(self.device), targets.to(self.device))

    # -- backdoor attacks (attacks.backdoor) ----------------------------------------------
    def _backdoored(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Training data after a backdoor attack's ``poison_samples`` on the Byzantine
        rows (a trigger stamped on a share of their images, relabelled to its target);
        the images chosen come from the run's ``attack/backdoor`` stream, drawn afresh
        from the seed at every (re-)deal."""
        if not isinstance(self.attack, BackdoorAttack) or not bool(self.byzantine.any()):
            return inputs, targets
        if self.num_classes is None:
            raise ValueError(f"attack {self.attack.name!r} plants a backdoor: it needs an image "
                             "classification task (num_classes), not a regression task")
        rows = self.byzantine.to(inputs.device).bool()
        stamped, labels = self.attack.poison_samples(inputs[rows], targets[rows], self.num_classes,
                                                     self.pixel_stats, make_generator(self.seed, "attack/backdoor"))
        inputs, targets = inputs.clone(), targets.clone()
        inputs[rows] = stamped.to(inputs.dtype)
        targets[rows] = labels.to(targets.dtype)
        return inputs, targets

    def _poisoned_targets(self, targets: Tensor) -> Tensor:
        """Training targets after a data attack's ``poison`` on the Byzantine rows."""
        poison = None if self.attack is None else self.attack.poison
        if poison is None or not bool(self.byzantine.any()):
            return targets
        if self.num_classes is None:
            raise ValueError(
                f"attack {self.attack.name!r} poisons labels: it needs a "
                "classification task (num_classes), not a regression task"
            )
        targets = targets.clone()
        rows = self.byzantine.to(targets.device).bool()
        targets[rows] = poison(targets[rows], self.num_classes).to(targets.dtype)
        return targets

    # -- facts ------------------------------------------------------------------------
    @property
    def clients(self) -> int:
        return self.train.inputs.shape[0]

    @property
    def honest(self) -> Tensor:
        return ~self.byzantine

    @property
    def byzantine_facts(self) -> "MaskFacts":
        """Facts of the Byzantine mask (is any client Byzantine, is every one, are the
        Byzantine rows one block), read once per mask on the host: the engines ask them
        every round, and reading them from a device tensor would make the host wait for
        the device each time (issue 45: no host synchronisation in a step).  A mask
        replaced or changed in place is read afresh."""
        mask = self.byzantine
        cached = self._host_mask
        if cached is None or cached[0] is not mask or cached[1] != mask._version:
            cached = (mask, mask._version, MaskFacts.of(mask))
            self._host_mask = cached
        return cached[2]

    @property
    def byzantine_rows_read(self) -> bool:
        """Whether the honest values of Byzantine senders' messages can matter: with no
        attack they are sent as they are; an attack that declares
        ``reads_messages = False`` overwrites them unread, and one that declares
        ``reads_own_rows = False`` reads only the honest senders' rows, so an engine may
        skip computing them (not when no client is honest: the attack's reference rows
        are then its own)."""
        if self.attack is None or self.byzantine_facts.every:
            return True
        return attack_reads_own_rows(self.attack)

    def honest_first(self, clients: Tensor) -> Tensor:
        """``clients`` reordered with the honest ones first (stable within each part)."""
        order = torch.argsort(self.byzantine[clients].to(torch.int8), stable=True)
        return clients[order]

    @property
    def clusters(self) -> int:
        return int(self.cluster_ids.max().item()) + 1

    @property
    def dtype(self) -> torch.dtype:
        return self.train.inputs.dtype

    def rng(self, stream: str) -> torch.Generator:
        """A fresh generator for a named stream of this run (e.g. an algorithm's)."""
        return make_generator(self.seed, stream, self.device)

    def init_params(self, count: int, stream: str = "init") -> Tensor:
        """``count`` initial parameter rows from the objective's initialiser."""
        cpu = make_generator(self.seed, stream)
        return self.objective.init(count, cpu, self.dtype).to(self.device)

    # -- client computation -------------------------------------------------------------
    def sample_batch(self, reuse: bool = False) -> Batch:
        """This round's batch for every client (seeded, one gather).  ``reuse=True``
        gathers into a buffer that the next ``reuse=True`` call overwrites (for a batch
        consumed at once); the values are the same either way."""
        if not reuse or self.batch_size is None or self.batch_size >= self.train.samples_per_client:
            return self.train.sample(self.batch_size, self._batch_rng)
        buffer = self._batch_buffer
        if (
            buffer is None
            or buffer.inputs.dtype != self.train.inputs.dtype
            or not same_device(buffer.inputs.device, self.train.inputs.device)
        ):
            shape = (self.clients, self.batch_size)
            self._batch_buffer = Batch(
                self.train.inputs.new_empty(*shape, *self.train.inputs.shape[2:]),
                self.train.targets.new_empty(*shape, *self.train.targets.shape[2:]),
            )
        return self.train.sample(self.batch_size, self._batch_rng, out=self._batch_buffer)

    def gradients(
        self,
        params: Tensor,
        batch: Batch,
        out: Tensor | None = None,
        skip_unread: bool = False,
        blend: float | None = None,
    ) -> Tensor:
        """Honest ``g_i(x_i)`` for all clients: ``params[N, d] -> [N, d]`` (into the
        reusable buffer ``out`` if given; ``blend = alpha`` blends them into ``out``
        as ``torch.lerp(out, g, alpha)`` instead, see
        :meth:`~robust_pfl.engine.objectives.Objective.paired_gradients`).

        ``skip_unread=True`` (with ``out``): when the attack overwrites the Byzantine
        rows unread (:attr:`byzantine_rows_read` is false) and they form one block of
        rows, only the honest rows are computed and the Byzantine rows of ``out`` are
        left as they are."""
        span = None if not skip_unread or out is None or self.byzantine_rows_read else self.byzantine_facts.span
        samples = batch.inputs.shape[1]
        if span is None:
            self.sample_gradients += params.shape[0] * samples
            return self.objective.paired_gradients(params, batch, out=out, blend=blend)
        self.sample_gradients += (params.shape[0] - (span[1] - span[0])) * samples
        for start, stop in ((0, span[0]), (span[1], self.clients)):
            if stop > start:
                part = Batch(batch.inputs[start:stop], batch.targets[start:stop])
                self.objective.paired_gradients(params[start:stop], part, out=out[start:stop], blend=blend)
        return out

    def cross_gradients(self, params: Tensor, batch: Batch, out: Tensor | None = None) -> Tensor:
        """Honest ``g_j(x_m)`` for model rows ``params[M, d]``: ``[M, N, d]``."""
        self.sample_gradients += params.shape[0] * batch.inputs.shape[0] * batch.inputs.shape[1]
        return self.objective.cross_gradients(params, batch, out=out)

    def cross_losses(self, params: Tensor, batch: Batch) -> Tensor:
        """Honest ``f_j(x_m)`` for model rows ``params[M, d]``: ``[M, N]``."""
        self.sample_gradients += params.shape[0] * batch.inputs.shape[0] * batch.inputs.shape[1]
        return self.objective.cross_losses(params, batch)

    def chunks(self, rows: Tensor, bytes_per_row: int, budget_bytes: int) -> Iterator[Tensor]:
        """Split index tensor ``rows`` into chunks whose working set fits the budget."""
        size = max(1, budget_bytes // max(1, bytes_per_row))
        for start in range(0, rows.numel(), size):
            yield rows[start : start + size]

    # -- the injection point ------------------------------------------------------------
    def deliver(
        self,
        messages: Tensor,
        round_index: int,
        kind: MessageKind,
        receivers: Tensor | None = None,
        defense_state: Mapping[str, Any] | None = None,
        senders: Tensor | None = None,
        inplace: bool = False,
        out: Tensor | None = None,
        byzantine_only: bool = False,
        needed: Tensor | None = None,
    ) -> Tensor:
        """Messages ``[..., S, d]`` as the aggregator receives them: honest rows
        unchanged, Byzantine rows replaced by the attack's output.  ``senders`` lists
        the client index of each of the ``S`` rows (default: all N clients in order).
        Without an attack, or without Byzantine senders, messages pass unchanged.
        ``inplace=True`` writes the Byzantine rows into ``messages`` itself (for a
        caller-owned workspace: saves one full copy per call); ``out``, a reusable
        buffer shaped like ``messages``, receives the delivered messages instead of a
        fresh copy (large fresh allocations cost page faults).

        ``byzantine_only=True`` returns only the Byzantine senders' rows ``[..., B, d]``
        (in ``byzantine.nonzero()`` order): what a graph system needs when every
        receiver gets the same honest broadcast but its own Byzantine messages
        (``messages`` may then be an expanded view; attacks never write to it).

        ``needed[..., B]`` (with ``byzantine_only``) marks the Byzantine rows the caller
        reads; the result is then those rows alone, ``[P, d]`` in the order of
        ``needed.nonzero()``.  An attack whose rows are independent draws
        (:func:`~robust_pfl.engine.types.attack_draws_rows_apart`) draws only them; any
        other attack makes every row and the needed ones are picked.

        Messages of kind ``"loss"`` (reported losses) are replaced only by an attack
        that forges losses (:func:`~robust_pfl.engine.types.attack_forges_losses`)."""
        byzantine = self.byzantine if senders is None else self.byzantine[senders]
        # the whole federation's mask: its facts are known on the host (no sync)
        facts = self.byzantine_facts if senders is None else MaskFacts.of(byzantine)
        if needed is not None:
            if not byzantine_only:
                raise ValueError("needed selects Byzantine rows: it needs byzantine_only=True")
            expected = (*messages.shape[:-2], int(byzantine.sum()))
            if tuple(needed.shape) != expected:
                raise ValueError(f"needed must be shaped {expected} (the messages' leading dims, then one "
                                 f"entry per Byzantine sender); got {tuple(needed.shape)}")
        cluster_ids = self.cluster_ids if senders is None else self.cluster_ids[senders]
        untouched = self.attack is None or not facts.some
        if not untouched and kind == "loss":
            untouched = not attack_forges_losses(self.attack)
        if untouched:
            if not byzantine_only:
                return messages
            return messages[..., byzantine, :] if needed is None else _needed_rows(messages, byzantine, needed)
        context = AttackContext(
            round_index=round_index,
            kind=kind,
            byzantine=byzantine,
            cluster_ids=cluster_ids,
            generator=self._attack_rng,
            receivers=receivers,
            senders=senders,
            defense_state=dict(defense_state or {}),
            memory=self._attack_memory,
        )
        writer = _row_writer(self.attack)
        if byzantine_only and writer is not None:
            if needed is not None and attack_draws_rows_apart(self.attack):
                return _needed_draws(writer, messages, needed, context)
            rows = messages.new_empty(*messages.shape[:-2], int(byzantine.sum()), messages.shape[-1])
            writer(messages, rows, context)
            return _picked(rows, needed)
        span = None if writer is None else facts.span
        if span is not None:
            # the Byzantine rows are one block and the attack never reads them: it
            # writes straight into the delivered tensor (no fresh rows, no scatter)
            delivered = self._delivery_target(messages, inplace, out)
            writer(delivered, delivered[..., span[0] : span[1], :], context)
            return delivered
        malicious = self.attack(messages, context)
        expected = (*messages.shape[:-2], int(byzantine.sum()), messages.shape[-1])
        if tuple(malicious.shape) != expected:
            raise ValueError(
                f"attack returned shape {tuple(malicious.shape)}, expected {expected}"
            )
        if byzantine_only:
            return _picked(malicious.to(messages.dtype), needed)
        delivered = self._delivery_target(messages, inplace, out)
        delivered[..., byzantine, :] = malicious.to(messages.dtype)
        return delivered

    @staticmethod
    def _delivery_target(messages: Tensor, inplace: bool, out: Tensor | None) -> Tensor:
        if inplace:
            return messages
        return messages.clone() if out is None else out.copy_(messages)


def _needed_draws(
    writer: Callable[[Tensor, Tensor, AttackContext], None], messages: Tensor, needed: Tensor, context: AttackContext
) -> Tensor:
    """``[P, d]``: the attack's rows for the pairs ``needed[..., B]`` marks, written
    one block per leading row (receiver) in order, so that the values do not depend on
    how the caller groups its receivers.  The loop is over the attack's blocks, as
    :func:`attacks._stats.fill_normal`'s own."""
    rows = messages.new_empty(int(needed.sum()), messages.shape[-1])
    for block in rows.split(needed.reshape(-1, needed.shape[-1]).sum(-1).tolist()):
        if block.shape[0]:
            writer(messages, block, context)
    return rows


def _needed_rows(messages: Tensor, byzantine: Tensor, needed: Tensor) -> Tensor:
    """The rows of ``messages[..., S, d]`` that ``needed[..., B]`` marks among the
    Byzantine senders, ``[P, d]``, gathered without an ``[..., B, d]`` copy."""
    index = needed.nonzero().unbind(-1)
    senders = byzantine.nonzero().squeeze(-1)[index[-1]]
    return messages[(*index[:-1], senders)]


def _picked(rows: Tensor, needed: Tensor | None) -> Tensor:
    """``rows[..., B, d]``, or with ``needed[..., B]`` its needed rows ``[P, d]``."""
    return rows if needed is None else rows[needed]


def _row_writer(attack: AttackBase) -> Callable[[Tensor, Tensor, AttackContext], None] | None:
    """``(messages, rows, context) -> None`` writing the attack's rows into ``rows``
    (the Byzantine block, which the attack never reads): its ``write_rows`` when it
    reads no message, its ``write_from`` when it reads only the honest rows; else
    ``None``."""
    if not attack_reads_messages(attack):
        write_rows = attack.write_rows
        return None if write_rows is None else lambda messages, rows, context: write_rows(rows, context)
    return None if attack_reads_own_rows(attack) else attack.write_from


@dataclass(frozen=True)
class MaskFacts:
    """What the engines ask of a client mask, read on the host: whether any entry is
    set (``some``), whether every one is (``every``), and ``span``: ``(start, stop)``
    when the set entries are one non-empty contiguous block, else ``None``."""

    some: bool
    every: bool
    span: tuple[int, int] | None

    @classmethod
    def of(cls, mask: Tensor) -> "MaskFacts":
        """The facts of ``mask[N]`` (three host reads of a device mask: its set
        positions, the first and the last)."""
        positions = mask.nonzero().squeeze(-1)
        count = positions.numel()
        span = None
        if count:
            start, stop = int(positions[0]), int(positions[-1]) + 1
            span = (start, stop) if stop - start == count else None
        return cls(count > 0, count == mask.numel(), span)
