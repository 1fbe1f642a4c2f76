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

Each failed property raises :class:`ConformanceError` naming it.
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
from robust_pfl.engine.types import AttackBase, AttackContext, BackdoorAttack, attack_reads_own_rows

SENDERS, DIM, STACK = 7, 5, 3
BYZANTINE = torch.tensor([False, True, False, False, True, False, False])
BLOCK = torch.tensor([False, False, False, False, False, True, True])  # the Byzantine rows as one block
#: ``(C, H, W)`` of the images a backdoor's hooks are checked on, and ``B, n``: its
#: Byzantine clients and their images each.
IMAGE, CLIENTS, SAMPLES = (3, 28, 28), 3, 10
#: The hooks that make an attack a backdoor (:class:`BackdoorAttack`).
BACKDOOR_HOOKS = ("check_target", "part_masks", "poison_samples", "stamp_trigger")


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
