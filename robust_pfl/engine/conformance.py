"""What the public conformance checks share (:func:`attacks.check_attack`,
:func:`defenses.check_aggregator`): the error they raise."""

from __future__ import annotations


class ConformanceError(AssertionError):
    """An attack or a defense breaks a property of its contract; the message names it."""
