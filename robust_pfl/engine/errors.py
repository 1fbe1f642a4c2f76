"""The error every invalid input to a run raises: configs, checkpoints and data."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration; the message names the offending field."""
