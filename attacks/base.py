"""Attack registry, description and hyperparameter validation helpers.

Every attack is a frozen dataclass registered with :func:`register`, configured at
construction, and carries three class attributes:

* ``name``: the registry key;
* ``summary``: one line for ``robust-pfl attacks``;
* ``needs``: what the attacker must be able to see or do, a subset of
  :data:`NEED_TAGS`: ``"omniscient"`` (reads honest rows), ``"adaptive"`` (reads
  ``context.defense_state``), ``"defense_aware"`` (built against one named defense,
  which it may beat where it does little against others), ``"data"`` (poisons
  training data).  Where the answer
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

The built-in attacks are declared with :data:`attack_options` (a frozen pydantic
dataclass, :func:`robust_pfl.engine.validation.options`): each option is a typed field with
its constraints and a one-line description
(``scale: Annotated[float, Field(gt=0, description="...")] = 1.0``), and a bad value
raises ``ValueError`` naming ``<attack>.<field>``, what it accepts and what was given;
``__post_init__`` keeps only the rules between fields.  An attack of one's own may be
a plain ``@dataclasses.dataclass(frozen=True)`` validating in ``__post_init__``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from robust_pfl.engine.registry import check_options, did_you_mean, init_parameters, registrar
from robust_pfl.engine.types import AttackBase
from robust_pfl.engine.types import attack_reads_messages as reads_messages  # re-exported
from robust_pfl.engine.validation import descriptions, options

REGISTRY: dict[str, type] = {}

NEED_TAGS: frozenset[str] = frozenset({"omniscient", "adaptive", "defense_aware", "data"})


def _known_needs(cls: type) -> None:
    if not issubclass(cls, AttackBase):
        raise TypeError(f"attack {getattr(cls, 'name', cls.__name__)!r} must subclass attacks.AttackBase, which "
                        "declares what the engine reads of an attack")
    unknown = frozenset(cls.needs) - NEED_TAGS
    if unknown:
        raise ValueError(f"attack {cls.name!r}: unknown needs {sorted(unknown)}; allowed {sorted(NEED_TAGS)}")


register = registrar(REGISTRY, "attack", _known_needs)

#: Class decorator of the built-in attacks: a frozen pydantic dataclass whose bad
#: options raise ``ValueError`` naming ``<attack>.<field>`` (:mod:`robust_pfl.engine.validation`).
attack_options = options("attack")


#: The attack name of a run without Byzantine behaviour (no attack object at all).
NO_ATTACK = "none"


class UnknownAttack(ValueError):
    """An attack name that is neither registered nor :data:`NO_ATTACK`."""


def build(name: str, options: Mapping[str, Any] | None = None) -> AttackBase | None:
    """Construct a registered attack from plain options (validated by the class);
    ``None`` for :data:`NO_ATTACK`, which takes no options.

    Raises:
        UnknownAttack: an unknown name (with the allowed ones and the closest).
        ValueError: an option the attack does not take (with the attack's own options
            and defaults), or a bad value of one.
    """
    options = dict(options or {})
    if name == NO_ATTACK:
        check_options(name, f"attack {name!r}", options, {})
        return None
    if not isinstance(name, str) or name not in REGISTRY:
        allowed = [NO_ATTACK, *sorted(REGISTRY)]
        hint = did_you_mean(name, allowed) if isinstance(name, str) else ""
        raise UnknownAttack(f"unknown attack {name!r}{hint}; allowed: {allowed}")
    check_options(name, f"attack {name!r}", options, init_parameters(REGISTRY[name]))
    return REGISTRY[name](**options)


def describe(cls: type) -> dict[str, Any]:
    """What ``robust-pfl attacks`` prints for one attack class: ``name``, ``summary``,
    ``needs`` (sorted list; the class's upper bound), ``parameters`` (every
    constructor parameter with its default; ``"required"`` where there is none) and
    ``descriptions`` (``{parameter: one line}`` for those that have one)."""
    return {
        "name": cls.name,
        "summary": cls.summary,
        "needs": sorted(cls.needs),
        "parameters": init_parameters(cls),
        "descriptions": descriptions(cls),
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
