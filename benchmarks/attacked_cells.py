"""The benchmark cells the cost benchmarks time: a benchmark file's chosen defenses
under chosen attacks, at its first heterogeneity level with Byzantine fraction 0.2,
one seed, ``rounds`` rounds with metrics at the first and last only."""

from __future__ import annotations

from typing import Any, Iterator

from robust_pfl.worst_case.plan import ComboKey, build_plan
from robust_pfl.worst_case.spec import BenchmarkSpec


def attacked_cells(spec: BenchmarkSpec, defenses: set[str], attacks: list[str],
                   rounds: int) -> Iterator[tuple[ComboKey, dict[str, Any]]]:
    """``(combination key, cell config)`` of each defense labelled in ``defenses``
    under each of ``attacks`` (the file's own values, no tuning)."""
    spec = spec.model_copy(update={
        "defenses": [d for d in spec.defenses if d.display in defenses],
        "benchmark": spec.benchmark.model_copy(update={
            "fractions": [0.0, 0.2], "heterogeneity": spec.benchmark.heterogeneity[:1], "backdoors": [],
            "attacks": list(attacks)})})
    for key, combo in build_plan(spec).combos.items():
        if key[3] != 0.2:
            continue
        config = combo.config.model_copy(update={"seeds": [0]}).model_dump()
        config.update(rounds=rounds, eval_every=rounds)
        yield key, config
