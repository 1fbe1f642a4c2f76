"""Byzantine attacks, registered by name.

Each attack is a frozen dataclass subclassing :class:`AttackBase` (which declares,
with defaults, everything the engine reads of an attack), configured at construction
(parameters validated there): it receives the honest messages
``[..., S, d]`` and an :class:`~robust_pfl.engine.types.AttackContext`, and returns the
Byzantine rows ``[..., B, d]``.  Class attributes ``name``, ``summary`` and ``needs``
(``"omniscient"``, ``"adaptive"``, ``"data"``) describe it; :func:`describe` gives
what ``robust-pfl attacks`` prints.

Families: :mod:`attacks.simple` (large gradient, constant), :mod:`attacks.flips` (bit
flip), :mod:`attacks.noise` (Gaussian noise), :mod:`attacks.statistical` (ALIE, IPM,
mimic), :mod:`attacks.optimised` (min-max, min-sum), :mod:`attacks.adaptive`
(ball-edge), :mod:`attacks.search` (the ``optimised`` scale-search wrapper),
:mod:`attacks.scale_search` (ByzFL's Optimal-ALIE and Optimal-IPM), :mod:`attacks.fang`
(Fang et al.'s attacks on Krum and on the trimmed mean), :mod:`attacks.defense_aware`
(Blades' attacks on ClippedClustering and SignGuard) and
:mod:`attacks.data_poisoning` (label flip), :mod:`attacks.backdoor` (BadNets, DBA, model
replacement; the run records the attack success rate), :mod:`attacks.forged_loss` (forged loss
reports against loss-based clustering: IFCA, HypCluster, CLoVE) and
:mod:`attacks.graph_attacks` (neighbour poisoning from high-degree graph positions).

:func:`check_attack` (:mod:`attacks.conformance`) checks a class of your own against
the contract every registered attack meets.
"""

from attacks.base import NEED_TAGS, NO_ATTACK, REGISTRY, UnknownAttack, build, describe, reads_messages, register
from attacks.conformance import check_attack
from robust_pfl.engine.conformance import ConformanceError
from robust_pfl.engine.types import AttackBase
from attacks.simple import ConstantValue, Inf, LargeGradient
from attacks.flips import BitFlip
from attacks.noise import GaussianNoise
from attacks.statistical import ALIE, IPM, Mimic
from attacks.optimised import MinMax, MinSum
from attacks.adaptive import BallEdge
from attacks.search import Optimised
from attacks.scale_search import OptimalALIE, OptimalIPM
from attacks.fang import FangKrum, FangTrimmedMean
from attacks.defense_aware import ClippedClusteringAttack, SignGuardAttack
from attacks.data_poisoning import LabelFlip
from attacks.backdoor import DBA, BadNets, ModelReplacement
from attacks.forged_loss import ForgedLoss
from attacks.graph_attacks import NeighbourPoison

__all__ = [
    "AttackBase",
    "ConformanceError",
    "check_attack",
    "NEED_TAGS",
    "REGISTRY",
    "build",
    "NO_ATTACK",
    "UnknownAttack",
    "describe",
    "reads_messages",
    "register",
    "LargeGradient",
    "ConstantValue",
    "BitFlip",
    "GaussianNoise",
    "ALIE",
    "IPM",
    "Mimic",
    "MinMax",
    "MinSum",
    "BallEdge",
    "Optimised",
    "OptimalALIE",
    "OptimalIPM",
    "FangKrum",
    "FangTrimmedMean",
    "ClippedClusteringAttack",
    "SignGuardAttack",
    "Inf",
    "LabelFlip",
    "BadNets",
    "DBA",
    "ModelReplacement",
    "ForgedLoss",
    "NeighbourPoison",
]
