"""Attack registry, description and hyperparameter validation helpers.

Every attack is a frozen dataclass registered with :func:`register`, configured at
construction (``__post_init__`` validates each field and raises ``ValueError`` naming
``<attack>.<field>`` and the allowed values), and carries three class attributes:

* ``name``: the registry key;
* ``summary``: one line for ``robust-pfl attacks``;
* ``needs``: what the attacker must be able to see or do, a subset of
  :data:`NEED_TAGS`: ``"omniscient"`` (reads honest rows), ``"adaptive"`` (reads
  ``context.defense_state``), ``"data"`` (poisons training data).  Where the answer
  depends on the configuration (``bit_flip(source="own")`` reads no honest row), the
  class value is the upper bound and :class:`NeedsBy` gives each instance its own.

An attack may also declare ``reads_messages = False`` (a class attribute or a property)
when its output never depends on the message values it is handed, only on their shape
and its random stream (large gradient, constant rows).  Engines then skip computing
the honest vectors of Byzantine senders; see :func:`reads_messages`.  Such an attack may
also offer ``write_rows(rows, context)``, which writes exactly the rows ``__call__``
would return into ``rows`` in place (a view into the engine's workspace: no fresh
allocation per delivery).

An attack that reads only the honest senders' rows (bit flip of an honest client's
gradient) may declare ``reads_own_rows = False``: engines then skip the Byzantine
senders' honest vectors too, but hand the attack the honest rows as usual.  Such an
attack may offer ``write_from(messages, rows, context)``, which writes the rows
``__call__(messages, context)`` would return into ``rows``, the Byzantine block of
``messages`` itself.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Mapping

from robust_pfl.registry import check_options, did_you_mean, init_parameters, registrar
from robust_pfl.types import Attack, AttackBase
from robust_pfl.types import attack_reads_messages as reads_messages  # re-exported

REGISTRY: dict[str, type] = {}

NEED_TAGS: frozenset[str] = frozenset({"omniscient", "adaptive", "data"})


def _known_needs(cls: type) -> None:
    if not issubclass(cls, AttackBase):
        raise TypeError(f"attack {getattr(cls, 'name', cls.__name__)!r} must subclass attacks.AttackBase, which "
                        "declares what the engine reads of an attack")
    unknown = frozenset(cls.needs) - NEED_TAGS
    if unknown:
        raise ValueError(f"attack {cls.name!r}: unknown needs {sorted(unknown)}; allowed {sorted(NEED_TAGS)}")


register = registrar(REGISTRY, "attack", _known_needs)


def build(name: str, options: Mapping[str, Any] | None = None) -> Attack:
    """Construct a registered attack from plain options (validated by the class).

    Raises:
        ValueError: an unknown name (with the registered ones), or an option the
            attack does not take (with the attack's own options and defaults).
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown attack {name!r}{did_you_mean(name, REGISTRY)}; registered: {sorted(REGISTRY)}")
    options = dict(options or {})
    check_options(name, f"attack {name!r}", options, init_parameters(REGISTRY[name]))
    return REGISTRY[name](**options)


def describe(cls: type) -> dict[str, Any]:
    """What ``robust-pfl attacks`` prints for one attack class: ``name``, ``summary``,
    ``needs`` (sorted list; the class's upper bound) and ``parameters`` (every
    constructor parameter with its default; ``"required"`` where there is none)."""
    return {
        "name": cls.name,
        "summary": cls.summary,
        "needs": sorted(cls.needs),
        "parameters": init_parameters(cls),
    }


class NeedsBy:
    """A ``needs`` attribute that depends on the configuration: read on the class it
    gives ``upper`` (what :func:`describe` prints), read on an instance it gives
    ``rule(instance)``."""

    def __init__(self, upper: frozenset[str], rule: Callable[[Any], frozenset[str]]) -> None:
        self.upper = frozenset(upper)
        self.rule = rule

    def __get__(self, instance: Any, owner: type | None = None) -> frozenset[str]:
        return self.upper if instance is None else frozenset(self.rule(instance))


# -- hyperparameter validation ------------------------------------------------------------
def require_number(attack: str, field: str, value: object) -> None:
    """``value`` must be a real number (bool is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{attack}.{field} must be a number, got {value!r}")


def require_finite(attack: str, field: str, value: object, low: float | None = None,
                   high: float | None = None, open_low: bool = False, open_high: bool = False) -> None:
    """``value`` must be a finite number in ``[low, high]`` (``(`` / ``)`` when open)."""
    require_number(attack, field, value)
    number = float(value)  # type: ignore[arg-type]
    ok = math.isfinite(number)
    ok = ok and (low is None or (number > low if open_low else number >= low))
    ok = ok and (high is None or (number < high if open_high else number <= high))
    if not ok:
        left = "-inf" if low is None else f"{low:g}"
        right = "inf" if high is None else f"{high:g}"
        interval = f"{'(' if open_low or low is None else '['}{left}, {right}{')' if open_high or high is None else ']'}"
        raise ValueError(f"{attack}.{field} must be a finite number in {interval}, got {value!r}")


def require_int(attack: str, field: str, value: object, low: int | None = None) -> None:
    """``value`` must be an integer (bool is not), at least ``low`` if given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{attack}.{field} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{attack}.{field} must be an integer >= {low}, got {value!r}")


def require_choice(attack: str, field: str, value: object, allowed: Collection[str]) -> None:
    """``value`` must be one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{attack}.{field} must be one of {sorted(allowed)}, got {value!r}")
