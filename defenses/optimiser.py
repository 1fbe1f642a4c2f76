"""The per-client optimiser step every algorithm applies: heavy-ball SGD on ``[N, d]``
rows, with non-finite rows skipped so that no NaN or Inf reaches a model."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from robust_pfl.engine.devices import same_device


class HeavyBall:
    """Per-row heavy-ball SGD, ``m = mu m + v; x -= lr m`` (``mu = 0``: plain SGD).

    Rows whose update is not finite are skipped (treated as a zero update) and counted
    in ``skipped``: whatever a defense lets through, no NaN or Inf ever reaches a
    parameter row.
    """

    _buffer_bound: tuple[Tensor, int, float] | None = None  # a class default: older checkpoints load too

    def __init__(self, lr: float, momentum: float, like: Tensor) -> None:
        self.lr = lr
        self.momentum = momentum
        # Plain SGD never reads its buffer: it is made (zeros) only when asked for, so a
        # per-round local optimiser costs no [N, d] tensor.
        self._buffer: Tensor | None = torch.zeros_like(like) if momentum else None
        self._like = (like.shape, like.dtype, like.device)
        self.skipped = 0
        self._spare: Tensor | None = None  # next buffer, for whole-tensor steps
        self._moved: Tensor | None = None  # candidate parameters, for whole-tensor steps
        # (params, its version counter, a bound on max|params|) after an in-place step
        self._bound: tuple[Tensor, int, float] | None = None
        self._buffer_bound = None  # the same for the momentum buffer

    def __getstate__(self) -> dict[str, Any]:
        """Pickled state (a checkpoint): without the two scratch tensors (rebuilt on
        the next whole-tensor step), and with the carried bound marked valid or not,
        since unpickled tensors restart their version counters."""
        state = {**self.__dict__, "_spare": None, "_moved": None}
        for name in ("_bound", "_buffer_bound"):
            carried = getattr(self, name, None)
            if carried is not None:
                tensor, version, bound = carried
                state[name] = (tensor, tensor._version == version, bound)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "buffer" in state:  # a checkpoint written before the buffer became lazy
            buffer = state.pop("buffer")
            state.update(_buffer=buffer, _like=(buffer.shape, buffer.dtype, buffer.device))
        self.__dict__.update(state)
        for name in ("_bound", "_buffer_bound"):
            carried = state.get(name)
            if carried is not None:
                tensor, valid, bound = carried
                setattr(self, name, (tensor, tensor._version, bound) if valid else None)

    def fits(self, lr: float, momentum: float, like: Tensor) -> bool:
        """Whether this optimiser has ``lr`` and ``momentum`` and rows shaped as ``like``."""
        if (self.lr, self.momentum) != (lr, momentum):
            return False
        shape, dtype, device = self._like
        return (shape, dtype) == (like.shape, like.dtype) and same_device(device, like.device)

    def restart(self) -> None:
        """Back to a fresh optimiser's state (zero momentum, nothing skipped), keeping
        the scratch memory."""
        if self._buffer is not None:
            self._buffer.zero_()
            self._buffer_bound = (self._buffer, self._buffer._version, 0.0)
        self.skipped = 0
        self._bound = None

    @property
    def buffer(self) -> Tensor:
        """The momentum buffer ``m`` (zeros until a step with momentum writes it)."""
        if self._buffer is None:
            shape, dtype, device = self._like
            self._buffer = torch.zeros(shape, dtype=dtype, device=device)
        return self._buffer

    @buffer.setter
    def buffer(self, value: Tensor) -> None:
        self._buffer = value
        self._like = (value.shape, value.dtype, value.device)

    def apply(self, params: Tensor, update: Tensor, rows: Tensor | None = None) -> None:
        """Update ``params`` in place with ``update`` on ``rows`` (all rows if None).

        A row is committed only if its update, its new momentum buffer and its new
        parameters are all finite (a finite but huge update can still overflow);
        otherwise that row keeps its parameters and buffer and counts as skipped.
        """
        if rows is None:
            self._apply_all(params, update)
            return
        if self.momentum:
            buffer = torch.add(update, self.buffer[rows], alpha=self.momentum)  # new tensor
        else:
            buffer = update
        moved = torch.add(params[rows], buffer, alpha=-self.lr)
        buffer, moved = self._vetted(update, buffer, moved, params, rows)
        if self.momentum:
            self.buffer[rows] = buffer
        params[rows] = moved

    def apply_gathered(self, params: Tensor, source: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor | None:
        """``apply(params, source[index])`` when every update row is one of a few
        ``source`` rows (Alg. 4 sends each client its cluster's centre).  With ``out``
        the gathered updates land there and are returned; without, they are formed only
        where the checked path needs them, and ``None`` is returned.

        Without momentum, when every source row passes :meth:`apply`'s check and no
        parameter can overflow (``d (max|x| + lr max|v|)`` under half the dtype's
        maximum, which also keeps every new row's sum finite), no row can be skipped:
        each source row is subtracted in place from the rows that use it, with
        :meth:`apply`'s own arithmetic (``x + (-lr) v``), saving the candidate tensor,
        its checks and its copy.  ``max|x|`` is carried from the previous step while
        nothing else wrote to ``params``.  Otherwise this is :meth:`apply`."""
        updates = None if out is None else torch.index_select(source, 0, index, out=out)
        if self.momentum == 0 and bool(_finite_rows(source).all()) and params.numel():
            largest = self._largest(params) + self.lr * _max_abs(source)
            if params.shape[-1] * largest < 0.5 * torch.finfo(params.dtype).max:  # NaN fails too
                _subtract_rows(params, source, index, self.lr)
                eps = torch.finfo(params.dtype).eps
                self._bound = (params, params._version, largest * (1 + 4 * eps))
                return updates
        self.apply(params, torch.index_select(source, 0, index) if updates is None else updates)
        return updates

    def _largest(self, params: Tensor) -> float:
        """``max|x|`` over ``params``, or an upper bound on it carried from the last
        in-place step when ``params`` was not written since (its version counter)."""
        return _carried_max(params, self._bound)

    def _step_in_place(self, params: Tensor, update: Tensor) -> bool:
        """:meth:`_apply_all` written straight into ``params`` and the buffer, when no
        row can fail its check: with every entry of the update, the new buffer and the
        new parameters below half the dtype's maximum over ``d``, every row sum is
        finite, so the checked path would commit every row.  The same arithmetic as
        that path (bit for bit), without its candidate tensors, three row-sum passes
        and copy.  Bounds on ``max|x|`` and ``max|m|`` carry over from step to step;
        NaN or Inf in the update fails the test.  Returns whether it stepped."""
        if params.numel() == 0 or update.shape != params.shape or self.lr < 0 or self.momentum < 0:
            return False  # the bounds below add lr and momentum as they are
        limit = 0.5 * torch.finfo(params.dtype).max / params.shape[-1]
        widen = 1 + 4 * torch.finfo(params.dtype).eps  # the rounding of each new entry
        largest_update = _max_abs(update)
        step = largest_update
        if self.momentum:
            step = (largest_update + self.momentum * _carried_max(self.buffer, self._buffer_bound)) * widen
        moved = (self._largest(params) + self.lr * step) * widen
        if not (largest_update < limit and step < limit and moved < limit):  # NaN compares False
            return False
        if self.momentum:
            torch.add(update, self.buffer, alpha=self.momentum, out=self.buffer)
            self._buffer_bound = (self.buffer, self.buffer._version, step)
        params.add_(self.buffer if self.momentum else update, alpha=-self.lr)
        self._bound = (params, params._version, moved)
        return True

    def _apply_all(self, params: Tensor, update: Tensor) -> None:
        """:meth:`apply` on every row: in place when no row can fail its check
        (:meth:`_step_in_place`), else through two reused scratch tensors (a fresh
        ``[N, d]`` result per round costs page faults) with the row path's checks."""
        if self._step_in_place(params, update):
            return
        if self._moved is None or self._moved.shape != params.shape:
            self._moved = torch.empty_like(params)
            self._spare = torch.empty_like(params) if self.momentum else None
        if self.momentum:
            buffer = torch.add(update, self.buffer, alpha=self.momentum, out=self._spare)
        else:
            buffer = update
        moved = torch.add(params, buffer, alpha=-self.lr, out=self._moved)
        buffer, moved = self._vetted(update, buffer, moved, params)
        if buffer is self._spare:  # swap instead of copying
            self._spare, self.buffer = self.buffer, buffer
        elif self.momentum:
            self.buffer.copy_(buffer)
        params.copy_(moved)


    def _vetted(
        self, update: Tensor, buffer: Tensor, moved: Tensor, params: Tensor, rows: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(buffer, moved)`` for ``rows`` (all if None), with every row whose update,
        new buffer or new parameters are not finite (row sums) put back to its old
        values and counted in :attr:`skipped`.  Without momentum the buffer is the
        update itself."""
        ok = _finite_rows(buffer) & _finite_rows(moved)
        if buffer is not update:
            ok &= _finite_rows(update)
        if bool(ok.all()):
            return buffer, moved
        ok = ok.unsqueeze(-1)
        self.skipped += int((~ok).sum())
        index = slice(None) if rows is None else rows
        # plain SGD keeps no buffer: the update stands in for it and is never stored
        kept = torch.where(ok, buffer, self.buffer[index]) if self.momentum else buffer
        return kept, torch.where(ok, moved, params[index])


def _subtract_rows(params: Tensor, source: Tensor, index: Tensor, lr: float) -> None:
    """``params[i] += -lr * source[index[i]]`` in place, one ``index_add_`` per source
    row over the rows that use it (no ``[N, d]`` gather; the loop is over the few
    source rows, not clients)."""
    order = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=source.shape[0]).tolist()
    for row, rows in enumerate(torch.split(order, counts)):
        if rows.numel():
            params.index_add_(0, rows, source[row].expand(rows.numel(), -1), alpha=-lr)


def _carried_max(tensor: Tensor, carried: tuple[Tensor, int, float] | None) -> float:
    """``max|tensor|``, or the bound ``carried`` holds for it when it was set for this
    very tensor and the tensor was not written since (its version counter)."""
    if carried is not None:
        held, version, bound = carried
        if held is tensor and tensor._version == version:
            return bound
    return _max_abs(tensor)


def _max_abs(x: Tensor) -> float:
    """``max|x|`` from one ``aminmax``, much faster than ``vector_norm(ord=inf)``
    (benchmarks/README.md, "Kernel choices")."""
    low, high = torch.aminmax(x)
    return max(abs(float(low)), abs(float(high)))


def _finite_rows(x: Tensor) -> Tensor:
    """``[..., N]``: rows whose sum is finite.  NaN and Inf propagate into the sum, so
    every row with a non-finite entry is caught; a row of finite entries whose sum
    overflows (|entries| near the dtype's maximum) is conservatively rejected too.
    One reduction, no ``[N, d]`` temporary (``aminmax`` is several times slower here;
    benchmarks/README.md, "Kernel choices")."""
    return torch.isfinite(x.sum(dim=-1))
