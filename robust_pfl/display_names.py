"""Readable names of methods, aggregators and attacks for figures: ``ground_truth`` ->
``GT (oracle clusters)``, ``global+median`` -> ``Global + median``, ``large_gradient``
-> ``Large gradient``.

Results keep the ids and labels a config gives (they are what ``results --compare``
matches and what a grid's cells are keyed by); only what a reader sees is renamed, and
a label someone wrote (``CGPFL (K = 4)``, ``median``) is kept as written.  The tables
name every registered algorithm, robust aggregator, pre-aggregator and attack (a test
holds them to the registries), so a new one gets a name here or reads as its id.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

#: Registered algorithms (``[[methods]] name``), as papers name them.
METHOD_NAMES = {
    "fc": "FC", "mc": "MC", "local": "Local", "global": "Global", "ground_truth": "GT (oracle clusters)",
    "ifca": "IFCA", "ifca_model_avg": "IFCA (model averaging)", "cfl": "CFL", "cgpfl": "CGPFL",
    "cgpfl_heur": "CGPFL-Heur", "clove": "CLoVE", "ditto": "Ditto", "fedspd": "FedSPD", "fltrust": "FLTrust",
    "foolsgold": "FoolsGold", "hypcluster": "HypCluster", "knn_per": "KNN-Per", "myopic": "Myopic",
    "pdl_tc": "PDL-TC", "pfl_tc": "PFL-TC",
}
#: Robust aggregators and pre-aggregators, as they follow a method in a label
#: (``global+krum+nnm`` -> ``Global + Krum + NNM``).
AGGREGATOR_NAMES = {
    "mean": "mean", "median": "median", "trimmed_mean": "trimmed mean", "krum": "Krum", "multi_krum": "Multi-Krum",
    "geometric_median": "geometric median", "bulyan": "Bulyan", "centered_clipping": "centered clipping",
    "bucketing": "bucketing", "signguard": "SignGuard", "smea": "SMEA", "mda": "MDA", "dnc": "DnC", "flame": "FLAME",
    "caf": "CAF", "meamed": "MeaMed", "monna": "MoNNA", "clipped_clustering": "clipped clustering",
    "nnm": "NNM", "arc": "ARC", "clipping": "clipping",
}
#: Registered attacks, and ``none``.
ATTACK_NAMES = {
    "none": "No attack", "alie": "ALIE", "badnets": "BadNets", "ball_edge": "Ball edge", "bit_flip": "Bit flip",
    "clipped_clustering_attack": "Clipped-clustering attack", "constant": "Constant", "dba": "DBA",
    "fang_krum": "Fang (Krum)", "fang_trimmed_mean": "Fang (trimmed mean)", "forged_loss": "Forged loss",
    "gaussian_noise": "Gaussian noise", "inf": "Inf", "ipm": "IPM", "label_flip": "Label flip",
    "large_gradient": "Large gradient", "mimic": "Mimic", "min_max": "Min-max", "min_sum": "Min-sum",
    "model_replacement": "Model replacement", "neighbour_poison": "Neighbour poison", "optimal_alie": "Optimal ALIE",
    "optimal_ipm": "Optimal IPM", "optimised": "Optimised", "signguard_attack": "SignGuard attack",
}
_ID = re.compile(r"[a-z][a-z0-9_]*")


def _lookup(names: dict[str, str], word: str) -> str | None:
    """``names``' entry for ``word``, its id in any case (``Global``, ``GLOBAL``)."""
    return names.get(word, names.get(word.lower()))


def _with_options(label: str, readable: Callable[[str], str | None]) -> str:
    """``readable`` of the label's lead, its options (``, method.lr=0.1``, as the
    figures join axes) kept; the label itself where the lead has no readable name."""
    lead, comma, options = label.partition(", ")
    shown = readable(lead)
    return label if shown is None else shown + comma + options


def method_name(label: str) -> str:
    """A method's label as figures show it: a registered algorithm's id by its name,
    ``method+aggregator[+pre...]`` as ``Method + aggregator``; any other label as
    written."""

    def readable(lead: str) -> str | None:
        head, *rest = lead.split("+")
        method = _lookup(METHOD_NAMES, head)
        if method is None or not all(_lookup(AGGREGATOR_NAMES, part) for part in rest):
            return None
        return " + ".join([method, *(_lookup(AGGREGATOR_NAMES, part) for part in rest)])

    return _with_options(label, readable)


def attack_name(label: str) -> str:
    """An attack's label as figures show it: a registered attack's id by its name,
    another id (a plug-in's) with spaces and a capital; any other label as written."""

    def readable(lead: str) -> str | None:
        if lead in ATTACK_NAMES:
            return ATTACK_NAMES[lead]
        return lead.replace("_", " ").capitalize() if _ID.fullmatch(lead) else None

    return _with_options(label, readable)


def display_names(labels: Iterable[str], readable: Callable[[str], str]) -> dict[str, str]:
    """Each label's readable name, one to one: labels whose names would coincide
    (``global+median`` and ``Global+median`` in one store) keep their labels, so no
    two runs are drawn as one."""
    labels = list(dict.fromkeys(labels))
    shown = {label: readable(label) for label in labels}
    counts: dict[str, int] = {}
    for name in [*shown.values(), *labels]:
        counts[name] = counts.get(name, 0) + 1
    # a name another label already is, or two labels share: keep the label
    return {label: name if name == label or counts[name] == 1 else label for label, name in shown.items()}
