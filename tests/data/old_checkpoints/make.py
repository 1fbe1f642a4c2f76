"""Writes the checkpoints ``tests/test_checkpoint.py`` resumes as *old* ones: run at
commit d6839b2, before the engine moved to ``robust_pfl.engine`` and the aggregators
to ``defenses.aggregators``, so their pickles name the modules classes lived in then.
Each run stops in round 5 of its 9, so the file holds the state after round 4;
``configs.json`` holds the configs.  They were written on an AMD EPYC: a test reads
them exactly (loading does no arithmetic) but compares what it computes from them
within a tolerance, since another CPU may round the resumed rounds differently.

    python tests/data/old_checkpoints/make.py   (only meaningful at that commit)
"""

from __future__ import annotations

import json
from pathlib import Path

from robust_pfl.config import parse_config
from robust_pfl.experiments import run_method, validate

HERE = Path(__file__).resolve().parent
TASK = {"name": "synthetic_linear", "clusters": 2, "clients_per_cluster": 4}
CASES = {
    "fc": ({"name": "fc", "lr": 0.05, "heavy_ball": 0.9, "groups": 2}, {"name": "large_gradient"}),
    "mc": ({"name": "mc", "lr": 0.05, "heavy_ball": 0.5}, {"name": "ball_edge"}),
    "global-krum-nnm": (
        {"name": "global", "lr": 0.05, "aggregator": {"name": "krum", "f": 2, "pre": ["nnm"]}},
        {"name": "alie"},
    ),
    "global-bulyan": ({"name": "global", "lr": 0.05, "aggregator": {"name": "bulyan", "f": 1}}, {"name": "optimised"}),
    "ifca": ({"name": "ifca", "lr": 0.05, "heavy_ball": 0.5}, {"name": "large_gradient"}),
}


class Stop(Exception):
    pass


def config(method: dict, attack: dict) -> dict:
    return {"seeds": [3], "rounds": 9, "eval_every": 2, "checkpoint_every": 2, "byzantine": {"total": 2},
            "task": TASK, "methods": [method], "attack": attack}


def main() -> None:
    configs = {}
    for name, (method, attack) in CASES.items():
        data = config(method, attack)
        configs[name] = data
        run = validate(parse_config(data))
        count = [0]

        def on_round() -> None:
            count[0] += 1
            if count[0] == 5:
                raise Stop

        try:
            run_method(run.methods[0], run, 3, on_round=on_round, checkpoint=HERE / f"{name}.pt")
        except Stop:
            pass
    (HERE / "configs.json").write_text(json.dumps(configs, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
