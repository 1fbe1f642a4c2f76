"""Byzantine attacks, registered by name.

Each attack is a small callable configured at construction (parameters validated
there) implementing :class:`robust_pfl.types.Attack`: it receives the honest messages
``[..., N, d]`` and an :class:`~robust_pfl.types.AttackContext`, and returns the
Byzantine rows.  The full library (bit flip, label flip, ALIE, IPM, min-max, ball-edge
...) is tracked as its own issue; this module holds the registry and the first attacks.
"""

from attacks.base import REGISTRY, build, register
from attacks.simple import LargeGradient, ConstantValue

__all__ = ["REGISTRY", "build", "register", "LargeGradient", "ConstantValue"]
