"""Public conformance checks for attacks: :func:`check_attack` runs on a class of your
own (in your tests) what the project's suite runs on every registered attack.

What an attack must do (:class:`robust_pfl.engine.types.AttackBase`):

* subclass :class:`~robust_pfl.engine.types.AttackBase`, with class attributes ``name``
  (str), ``summary`` (one line) and ``needs`` (a frozenset of
  :data:`attacks.NEED_TAGS`), as a frozen dataclass whose fields are its options;
* for messages ``[S, d]`` or ``[M, S, d]`` (float32 or float64) return a new tensor
  ``[..., B, d]`` (``B`` Byzantine senders), same dtype and device, without writing
  into the messages; the same generator seed gives the same rows;
* survive hostile input: NaN and Inf honest rows, a round where every sender is
  Byzantine, and global sender indices (a subgroup of the clients);
* read ``context.defense_state`` as the defenses publish it
  (:mod:`robust_pfl.engine.defense_state`): called with the declared state of every
  built-in defense (random tensors of the declared shapes, probes, ``None`` where a
  key is ``None`` in round 0), at each kind of delivery it declares, in rounds 0 and
  1, it returns its rows, reads no key that defense leaves out (``.get`` with a
  fallback does) and writes into none of the state's tensors;
* honour what it declares: ``reads_messages = False`` means its rows do not depend on
  the message values, ``reads_own_rows = False`` that they do not depend on the
  Byzantine senders' own rows; ``write_rows`` / ``write_from`` (optional fast paths)
  write exactly the rows the call returns;
* a backdoor (a subclass of :class:`~robust_pfl.engine.types.BackdoorAttack`, the only
  attacks whose trigger hooks the engine calls) declares ``"data"`` in ``needs``, an
  ``int`` ``target`` that ``check_target`` accepts and rejects as declared, ``[P, H,
  W]`` bool ``part_masks``, and ``stamp_trigger`` / ``poison_samples`` returning new
  tensors of the inputs' shapes, seeded, labels only ever kept or set to ``target``;
  an attack that defines those hooks without subclassing it is refused (the engine
  would never call them).

Each failed property raises :class:`ConformanceError` naming it (a key read that a
defense does not publish: the key and the defense).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import torch
from torch import Tensor

from attacks.base import NEED_TAGS, describe, reads_messages
from robust_pfl.engine.conformance import ConformanceError
from robust_pfl.engine.defense_state import DECLARED, Delivery, PublishedState, example_state
from robust_pfl.engine.types import (
    AttackBase,
    AttackContext,
    BackdoorAttack,
    MessageKind,
    attack_forges_losses,
    attack_reads_own_rows,
)

SENDERS, DIM, STACK = 7, 5, 3
BYZANTINE = torch.tensor([False, True, False, False, True, False, False])
BLOCK = torch.tensor([False, False, False, False, False, True, True])  # the Byzantine rows as one block
#: ``(C, H, W)`` of the images a backdoor's hooks are checked on, and ``B, n``: its
#: Byzantine clients and their images each.
IMAGE, CLIENTS, SAMPLES = (3, 28, 28), 3, 10
#: The hooks that make an attack a backdoor (:class:`BackdoorAttack`).
BACKDOOR_HOOKS = ("check_target", "part_masks", "poison_samples", "stamp_trigger")
#: The sizes of the defense states the checks hand an attack (the symbols of
#: :mod:`robust_pfl.engine.defense_state`): ``S`` senders, a subgroup of ``N`` clients
#: where the delivery lists its senders (else ``N = S``), ``R`` receivers, ``K`` centres.
STATE_SIZES = {"N": 9, "S": SENDERS, "R": STACK, "d": DIM, "K": 2}
#: The global client of each of the ``S`` senders of a subgroup delivery (FC's).
SUBGROUP = torch.tensor([8, 2, 5, 7, 0, 3, 1])
#: How a defense that publishes nothing delivers (an empty state).
_NO_STATE = Delivery(("gradient",), ("S", "d"), (), "")


def _require(condition: bool, attack: Any, message: str) -> None:
    if not condition:
        raise ConformanceError(f"{type(attack).__name__}: {message}")


def context(byzantine: Tensor = BYZANTINE, seed: int = 0, senders: Tensor | None = None) -> AttackContext:
    """A gradient round's context for the checks (seeded generator, one cluster)."""
    return AttackContext(round_index=0, kind="gradient", byzantine=byzantine,
                         cluster_ids=torch.zeros(byzantine.shape[0], dtype=torch.long),
                         generator=torch.Generator().manual_seed(seed), senders=senders)


def messages(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> Tensor:
    """Seeded honest-looking messages (standard normal plus 1)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) + 1.0


def identical(a: Tensor, b: Tensor) -> bool:
    """Bit-identical, NaN included."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check_attack(attack: Any, random: bool | None = None) -> None:
    """Check an attack class (built with its defaults) or instance against the
    contract of the module docstring.  ``random``: whether its rows are random draws
    (then a different seed must change them); ``None`` does not check it.

    Raises:
        ConformanceError: the first property that fails, named.
    """
    if isinstance(attack, type) and inspect.isabstract(attack):
        raise ConformanceError(f"{attack.__name__}: does not implement the abstract "
                               f"{', '.join(sorted(attack.__abstractmethods__))}")
    instance = attack() if isinstance(attack, type) else attack
    check_metadata(type(instance))
    check_defense_states(instance)  # first: an unguarded state read fails here, named
    check_shapes_and_determinism(instance, random)
    check_hostile_inputs(instance)
    check_declared_reads(instance)
    check_fast_paths(instance)
    if isinstance(instance, BackdoorAttack):
        check_backdoor(instance)


def check_metadata(cls: type) -> None:
    """A subclass of :class:`~robust_pfl.engine.types.AttackBase` with a ``name``, a one-line
    ``summary``, ``needs`` within :data:`NEED_TAGS`, a frozen dataclass, and
    :func:`attacks.describe` listing its options."""
    _require(isinstance(cls, type) and issubclass(cls, AttackBase), cls,
             "must subclass attacks.AttackBase (it declares what the engine reads of an attack)")
    _require(isinstance(getattr(cls, "name", None), str) and bool(cls.name), cls, "needs a class attribute name")
    summary = getattr(cls, "summary", None)
    _require(isinstance(summary, str) and bool(summary.strip()) and "\n" not in summary, cls,
             "needs a one-line class attribute summary")
    needs = getattr(cls, "needs", None)
    _require(isinstance(needs, frozenset) and needs <= NEED_TAGS, cls,
             f"needs must be a frozenset of {sorted(NEED_TAGS)}, got {needs!r}")
    _require(dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls,
             "must be a frozen dataclass (its fields are its options)")
    described = describe(cls)
    fields = {item.name for item in dataclasses.fields(cls) if item.init}
    _require(described["name"] == cls.name and set(described["parameters"]) == fields, cls,
             "describe() must list the name and every option")
    hooks = [hook for hook in BACKDOOR_HOOKS if callable(getattr(cls, hook, None))]
    _require(issubclass(cls, BackdoorAttack) or len(hooks) < 2, cls,
             f"defines the backdoor hooks {', '.join(hooks)} but does not subclass BackdoorAttack "
             "(the engine calls them only on its instances)")


def check_shapes_and_determinism(attack: Any, random: bool | None = None) -> None:
    """``[..., B, d]`` rows of the messages' dtype and device, a new tensor, the
    messages untouched, the same rows for the same seed (and, with ``random``, other
    rows for another seed), for ``[S, d]`` and ``[M, S, d]`` in float32 and float64."""
    count = int(BYZANTINE.sum())
    for dtype in (torch.float32, torch.float64):
        for shape in ((SENDERS, DIM), (STACK, SENDERS, DIM)):
            values = messages(*shape, dtype=dtype)
            original = values.clone()
            first = attack(values, context(seed=1))
            _require(identical(values, original), attack, "mutated the messages it was handed")
            _require(first.shape == (*shape[:-2], count, DIM), attack,
                     f"returned shape {tuple(first.shape)} for messages {shape}, expected {(*shape[:-2], count, DIM)}")
            _require(first.dtype == dtype and first.device == values.device, attack,
                     f"returned {first.dtype} on {first.device} for {dtype} messages on {values.device}")
            _require(first.data_ptr() != values.data_ptr(), attack, "returned a view of the messages")
            _require(identical(first, attack(values, context(seed=1))), attack, "the same seed gave other rows")
            if random:
                _require(not torch.equal(first, attack(values, context(seed=2))), attack,
                         "declared random, yet another seed gave the same rows")


def check_hostile_inputs(attack: Any) -> None:
    """NaN and Inf honest rows, every sender Byzantine, and global sender indices do
    not crash; with every sender Byzantine the rows are finite unless the attack reads
    no message (a constant or a large-gradient attack may send non-finite rows)."""
    values = messages(STACK, SENDERS, DIM)
    values[:, 0, 0] = math.nan
    values[:, 2, 1] = math.inf
    _require(attack(values, context()).shape == (STACK, 2, DIM), attack, "wrong shape with NaN / Inf honest rows")
    everyone = torch.ones(SENDERS, dtype=torch.bool)
    out = attack(messages(SENDERS, DIM), context(byzantine=everyone))
    _require(out.shape == (SENDERS, DIM), attack, "wrong shape when every sender is Byzantine")
    if reads_messages(attack):
        _require(bool(torch.isfinite(out).all()), attack, "non-finite rows when every sender is Byzantine")
    senders = torch.tensor([9, 2, 5, 7, 0, 3, 11])
    _require(attack(messages(SENDERS, DIM), context(senders=senders)).shape == (2, DIM), attack,
             "wrong shape with global sender indices")


def check_declared_reads(attack: Any) -> None:
    """``reads_messages = False``: the same rows for any message values (NaN
    included); ``reads_own_rows = False``: the same rows whatever the Byzantine
    senders' own rows hold."""
    values = messages(STACK, SENDERS, DIM)
    if not reads_messages(attack):
        garbage = torch.full_like(values, math.nan)
        _require(identical(attack(values, context(seed=4)), attack(garbage, context(seed=4))), attack,
                 "declares reads_messages = False but its rows depend on the message values")
    if not attack_reads_own_rows(attack):
        garbage = values.clone()
        garbage[:, BYZANTINE] = math.nan
        _require(identical(attack(values, context(seed=4)), attack(garbage, context(seed=4))), attack,
                 "declares reads_own_rows = False but its rows depend on the Byzantine senders' own rows")


class WatchedState(dict):
    """A ``defense_state`` that records the keys an attack reads, and those it reads
    with ``[]`` that are missing (``.get`` of a missing key is a guarded read)."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__(state)
        self.read: list[str] = []
        self.missing: list[str] = []

    def __getitem__(self, key: str) -> Any:
        (self.read if key in self else self.missing).append(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self:
            self.read.append(key)
        return super().get(key, default)


def check_defense_states(attack: Any, declared: tuple[PublishedState, ...] = DECLARED) -> None:
    """Called with every declared defense state (``declared``, by default every
    built-in defense's), at each kind of delivery it declares (loss reports only for an
    attack that forges losses), in rounds 0 and 1: ``[..., B, d]`` rows, no missing key
    read and no state tensor written.  A failure names the defense, the kind, the round
    and the key (a missing one; else those read, with their declared shapes)."""
    for published in declared:
        for delivery in published.deliveries or (_NO_STATE,):
            for kind in delivery.kinds:
                if kind == "loss" and not attack_forges_losses(attack):
                    continue  # the engine hands loss reports only to attacks that forge them
                for round_index in (0, 1):
                    check_defense_state(attack, published, delivery, kind, round_index)


def check_defense_state(attack: Any, published: PublishedState, delivery: Delivery, kind: MessageKind,
                        round_index: int) -> None:
    """One call of :func:`check_defense_states`."""
    sizes = dict(STATE_SIZES) if delivery.senders else {**STATE_SIZES, "N": STATE_SIZES["S"]}
    shape = tuple(sizes[dim] if isinstance(dim, str) else dim for dim in delivery.messages)
    values = messages(*shape, seed=round_index, dtype=torch.float32)
    senders = SUBGROUP if delivery.senders else None
    global_ids = SUBGROUP if senders is not None else torch.arange(sizes["S"])
    receivers = global_ids[~BYZANTINE][: sizes["R"]] if delivery.receivers else None
    state = WatchedState(example_state(delivery, round_index, sizes, torch.float32, torch.Generator().manual_seed(3)))
    before = {key: value.clone() for key, value in state.items() if isinstance(value, Tensor)}
    ctx = AttackContext(round_index=round_index, kind=kind, byzantine=BYZANTINE,
                        cluster_ids=torch.zeros(sizes["S"], dtype=torch.long),
                        generator=torch.Generator().manual_seed(5), receivers=receivers, senders=senders,
                        defense_state=state)
    where = f"the defense_state of {published.label} ({kind} deliveries, round {round_index})"
    try:
        rows = attack(values, ctx)
    except ConformanceError:
        raise
    except Exception as error:
        if state.missing:
            offered = ", ".join(key.name for key in delivery.keys) or "nothing"
            raise ConformanceError(
                f"{type(attack).__name__}: reads defense_state[{state.missing[0]!r}], which {published.label} does "
                f"not publish at {kind} deliveries (it publishes: {offered}); read it with .get and a fallback"
            ) from error
        raise ConformanceError(f"{type(attack).__name__}: fails on {where}, having read {_read(state, delivery)}: "
                               f"{type(error).__name__}: {error}") from error
    expected = (*shape[:-2], int(BYZANTINE.sum()), shape[-1])
    _require(isinstance(rows, Tensor) and tuple(rows.shape) == expected, attack,
             f"returned shape {tuple(getattr(rows, 'shape', ()))} on {where}, expected {expected}, having read "
             f"{_read(state, delivery)}")
    for key, value in before.items():
        _require(identical(state[key], value), attack, f"wrote into defense_state[{key!r}] of {where}")


def _read(state: WatchedState, delivery: Delivery) -> str:
    """The keys an attack read, with their declared shapes."""
    shapes = {key.name: key.shape_text() for key in delivery.keys}
    return ", ".join(f"{key} {shapes[key]}" for key in dict.fromkeys(state.read)) or "no key"


def check_fast_paths(attack: Any) -> None:
    """``write_rows`` (an attack that reads no message) and ``write_from`` (one that
    reads only the honest rows) write exactly the rows ``__call__`` returns into a
    strided block, and nothing else."""
    values = messages(STACK, SENDERS, DIM)
    returned = attack(values, context(byzantine=BLOCK, seed=9))
    if attack.write_rows is not None and not reads_messages(attack):
        workspace = values.clone()
        attack.write_rows(workspace[:, 5:], context(byzantine=BLOCK, seed=9))
        _require(identical(workspace[:, 5:], returned) and identical(workspace[:, :5], values[:, :5]), attack,
                 "write_rows wrote other rows than the call returns")
    if attack.write_from is not None and not attack_reads_own_rows(attack):
        workspace = values.clone()
        workspace[:, 5:] = math.nan  # never read
        attack.write_from(workspace, workspace[:, 5:], context(byzantine=BLOCK, seed=9))
        _require(identical(workspace[:, 5:], returned) and identical(workspace[:, :5], values[:, :5]), attack,
                 "write_from wrote other rows than the call returns")


def check_backdoor(attack: Any) -> None:
    """A backdoor's hooks (:class:`~robust_pfl.engine.types.BackdoorAttack`), on
    ``B`` clients' ``n`` images of :data:`IMAGE`, as pixels and normalised: ``"data"`` in
    ``needs``; an ``int`` ``target >= 0`` that ``check_target`` accepts with ``target + 1``
    classes and rejects with ``target`` (``ValueError`` naming ``<name>.target``);
    ``part_masks(H, W)`` ``[P, H, W]`` bool with ``P >= 1``; ``stamp_trigger`` and
    ``poison_samples`` return new tensors of the inputs' shapes and dtypes without writing
    into the inputs, the same for the same generator seed, every label either kept or
    ``target``."""
    name = attack.name
    _require("data" in frozenset(attack.needs), attack, "a backdoor poisons training data: needs must hold 'data'")
    target = getattr(attack, "target", None)
    _require(isinstance(target, int) and not isinstance(target, bool) and target >= 0, attack,
             f"a backdoor needs an int target >= 0 (the class triggered images go to), got {target!r}")
    try:
        attack.check_target(target + 1)
    except ValueError as error:
        raise ConformanceError(f"{type(attack).__name__}: check_target({target + 1}) refused target {target}: "
                               f"{error}") from error
    try:
        attack.check_target(target)
    except ValueError as error:
        _require(f"{name}.target" in str(error), attack,
                 f"check_target's error must name {name}.target, got {str(error)!r}")
    else:
        _require(False, attack, f"check_target({target}) accepted target {target}, not one of {target} classes")
    channels, height, width = IMAGE
    masks = attack.part_masks(height, width)
    _require(isinstance(masks, Tensor) and masks.dtype == torch.bool and masks.dim() == 3
             and masks.shape[0] >= 1 and tuple(masks.shape[1:]) == (height, width), attack,
             f"part_masks({height}, {width}) must be [P, {height}, {width}] bool with P >= 1, got "
             f"{tuple(masks.shape) if isinstance(masks, Tensor) else type(masks).__name__}")
    mean = torch.full((channels, 1, 1), 0.5)
    std = torch.full((channels, 1, 1), 0.25)
    pixels = torch.rand(CLIENTS, SAMPLES, *IMAGE, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, target + 2, (CLIENTS, SAMPLES), generator=torch.Generator().manual_seed(1))
    for stats, inputs in ((None, pixels), ((mean, std), (pixels - mean) / std)):
        original, original_labels = inputs.clone(), labels.clone()
        stamped = attack.stamp_trigger(inputs, stats)
        _require(identical(inputs, original), attack, "stamp_trigger wrote into its inputs")
        _require(isinstance(stamped, Tensor) and stamped.shape == inputs.shape and stamped.dtype == inputs.dtype
                 and stamped.data_ptr() != inputs.data_ptr(), attack,
                 "stamp_trigger must return a new tensor of the inputs' shape and dtype")
        first = attack.poison_samples(inputs, labels, target + 2, stats, torch.Generator().manual_seed(2))
        _require(identical(inputs, original) and identical(labels, original_labels), attack,
                 "poison_samples wrote into its inputs")
        _require(isinstance(first, tuple) and len(first) == 2, attack, "poison_samples must return (inputs, labels)")
        images, relabelled = first
        _require(images.shape == inputs.shape and images.dtype == inputs.dtype and relabelled.shape == labels.shape
                 and relabelled.dtype == labels.dtype, attack,
                 "poison_samples must return images and labels of the inputs' shapes and dtypes")
        _require(images.data_ptr() != inputs.data_ptr() and relabelled.data_ptr() != labels.data_ptr(), attack,
                 "poison_samples must return new tensors")
        _require(bool(((relabelled == labels) | (relabelled == target)).all()), attack,
                 "poison_samples may only keep a label or set it to target")
        again = attack.poison_samples(inputs, labels, target + 2, stats, torch.Generator().manual_seed(2))
        _require(identical(images, again[0]) and identical(relabelled, again[1]), attack,
                 "poison_samples gave other data for the same generator seed")
