"""How many operators a piece of work dispatches, counted on any device (issue 45:
"a launch count measurable without a GPU").

On an accelerator most steps at the sizes of the papers are bound by how many kernels
they launch and by how often the host waits for the device, not by arithmetic or
memory.  Both can be counted on the CPU: every tensor operation passes torch's
dispatcher, and :class:`LaunchCounter` (a ``TorchDispatchMode``) sees each one with its
schema.  Run the work under ``using_engine("batched")``
(:func:`robust_pfl.engine.devices.using_engine`) to count the accelerator's code paths
on the CPU.

What is counted, per operator call seen on the calling thread:

* ``kernels``: every operator that is not a view.  On a GPU each is (at most) one
  kernel launch; some (a ``copy_`` of zero elements, a scalar ``fill_``) launch none,
  so the count is an upper bound of the launches of the same code path.
* ``views``: operators whose result aliases an input (``view``, ``select``,
  ``transpose``...): metadata only, no launch.
* ``syncs``: operators whose result the host must read before it can go on
  (:data:`SYNC_OPERATORS`: ``.item()`` and ``bool()``/``int()``/``float()`` of a
  tensor, ``nonzero`` and boolean-mask indexing, ``torch.equal``, ``unique``), each a
  device-to-host synchronisation on a GPU.  ``.tolist()`` and ``.numpy()`` of a CPU
  tensor read memory without dispatching and are not seen; on a GPU they go through a
  ``_to_copy`` to the host, which is counted as a kernel only.

Operators run on other threads (the large-gradient attack's parallel normal draws on
the CPU) are not seen; the autograd engine's backward runs on the calling thread on
the CPU and is seen.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

T = TypeVar("T")

#: Operators (their ``aten`` names) whose result the host reads: a device-to-host
#: synchronisation on a GPU.  Indexing with a boolean mask (``index``, ``index_put_``)
#: syncs as well: see :data:`MASK_INDEXING`.
SYNC_OPERATORS = frozenset(
    {"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "equal", "is_nonzero",
     "_unique", "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave", "allclose"}
)

#: Operators that sync when one of their indices is a boolean mask (they find its
#: ``True`` entries on the host's behalf).
MASK_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


@dataclass
class LaunchCount:
    """What :class:`LaunchCounter` saw: ``kernels``, ``views`` and ``syncs`` (module
    docstring) and the calls per operator name (views and non-views)."""

    kernels: int = 0
    views: int = 0
    syncs: int = 0
    bytes: int = 0
    flops: int = 0
    by_operator: Counter = field(default_factory=Counter)
    bytes_by_operator: Counter = field(default_factory=Counter)

    def top(self, count: int = 5) -> list[tuple[str, int]]:
        """The ``count`` most called operators, most first."""
        return self.by_operator.most_common(count)

    def as_dict(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "views": self.views, "syncs": self.syncs, "bytes": self.bytes,
                "flops": self.flops, "by_operator": dict(self.by_operator.most_common()),
                "bytes_by_operator": dict(self.bytes_by_operator.most_common())}


def _is_view(func: Any) -> bool:
    """Whether ``func``'s first result aliases an input without writing it (a view;
    in-place and ``out=`` operators alias with a write and launch a kernel)."""
    returns = func._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in ``value`` (nested tuples, lists and dicts), each taken
    whole: what an operator reads or writes at most, if it touches every element."""
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    return 0


#: Operators that read only the rows they gather from their first argument (charged
#: their result twice: the rows read, the result written, plus the indices).
_GATHERS = frozenset({"index_select", "index", "gather", "take", "masked_select", "embedding",
                      "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"})
#: Operators that write into a subset of their first argument (charged the rest of
#: their arguments twice: read, and written into the first).
_SCATTERS = frozenset({"index_add_", "index_copy_", "index_put_", "_index_put_impl_", "index_fill_",
                       "scatter_", "scatter_add_", "scatter_reduce_", "masked_scatter_"})
#: Operators that read no input values (they take only a dtype, device or shape from
#: it): charged the result they fill, nothing for ``empty``.
_FILLS = frozenset({"new_zeros", "new_ones", "new_full", "zeros_like", "ones_like", "full_like", "zeros",
                    "ones", "full", "fill_", "zero_"})
_ALLOCATIONS = frozenset({"new_empty", "new_empty_strided", "empty_like", "empty", "empty_strided"})


def _moved_bytes(name: str, args: tuple, kwargs: dict | None, result: Any) -> int:
    """The bytes an operator reads and writes, as a model: every tensor argument and
    result whole, except for gathers, scatters, fills and allocations (above)."""
    if name in _ALLOCATIONS:
        return 0
    if name in _FILLS:
        return _tensor_bytes(result) if name not in ("fill_", "zero_") else _tensor_bytes(args[0])
    if name in _GATHERS:
        return 2 * _tensor_bytes(result) + _tensor_bytes(args[1:]) + _tensor_bytes(kwargs)
    if name in _SCATTERS:
        return 2 * (_tensor_bytes(args[1:]) + _tensor_bytes(kwargs))
    return _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(result)


#: Matrix products and where their two factors sit among the operator's arguments.
_PRODUCTS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2)}


def _matmul_flops(name: str, args: tuple) -> int:
    """``2 m n k`` (times the batch) of a matrix product, else 0."""
    if name not in _PRODUCTS:
        return 0
    first, second = (args[index] for index in _PRODUCTS[name])
    return 2 * first.numel() * second.shape[-1]


def _has_mask(args: tuple) -> bool:
    """Whether an indexing operator's index list (its second argument) holds a
    boolean tensor."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(index, Tensor) and index.dtype in (torch.bool, torch.uint8) for index in indices or ())


class LaunchCounter(TorchDispatchMode):
    """Counts every operator dispatched inside ``with LaunchCounter() as counter:``;
    the result is ``counter.count`` (a :class:`LaunchCount`)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = LaunchCount()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        self.count.by_operator[name] += 1
        result = func(*args, **(kwargs or {}))
        if _is_view(func):
            self.count.views += 1
            return result
        self.count.kernels += 1
        if name in SYNC_OPERATORS or (name in MASK_INDEXING and _has_mask(args)):
            self.count.syncs += 1
        moved = _moved_bytes(name, args, kwargs, result)
        self.count.bytes += moved
        self.count.bytes_by_operator[name] += moved
        self.count.flops += _matmul_flops(name, args)
        return result


def count_launches(work: Callable[[], T]) -> tuple[T, LaunchCount]:
    """``work()``'s result and the operators it dispatched (:class:`LaunchCounter`)."""
    with LaunchCounter() as counter:
        result = work()
    return result, counter.count
