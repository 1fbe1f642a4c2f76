"""A benchmark file: the defenses, the attack set, the Byzantine fractions, the
heterogeneity levels, the seeds and each defense's tuning grid (``robust-pfl
benchmark``), validated at load.

The file is a run config (``rounds``, ``batch_size``, ``[task]`` ...: what every cell
shares) without ``methods``, ``attack`` and ``byzantine``, which the benchmark sets per
cell, plus:

* ``[[defenses]]``: method tables as ``[[methods]]`` (``name``, ``label``, options),
  each with an optional ``tune``: a table of lists (``tune = { lr = [0.03, 0.1] }``),
  whose Cartesian product are the candidate settings, each value replacing the option
  of that name; or a list of tables, each one candidate's changes to the file's values
  (``tune = [{}, { lr = 0.03 }, { radius = 0.5 }]``: one factor at a time).
* ``[benchmark]``: ``fractions`` (Byzantine share of all clients, ``byzantine.fraction``;
  0 runs the clean cell, without attack), ``attacks`` (``"all"``: every registered attack
  but the backdoors; or a list of names and ``{name, label, options}`` tables),
  ``exclude_attacks``, ``backdoors`` (``"all"``, a list, or ``[]``: scored by attack
  success rate in a section of their own), ``heterogeneity`` (a list of tables of task
  options, each with a ``label``: the y axis), ``tolerance`` (how far below its clean
  accuracy a defense may fall and still hold: ``{ share = s }``, the share ``s`` of
  what it learned over chance, the default ``s = 0.2``; or ``{ points = p }`` / a
  number, ``p`` points), ``confidence`` (of the intervals that decide, 0.95),
  ``initial_seeds`` (the seeds every run starts with; the file's ``seeds`` are the
  pool that undecided cells draw from), ``racing`` (drop attacks and tuning
  candidates whose interval lies clearly on the safe side:
  :mod:`robust_pfl.worst_case.allocation`), ``candidate_attacks`` (the reference's
  worst surviving attacks the candidates race on), ``plateau`` (points the clean validation
  accuracy may still climb over the last quarter of a converged run),
  ``validation_per_client`` (every level's validation split, 10 by default),
  ``attack_options`` (options per attack name, for ``"all"`` and listed names),
  ``tune`` (``true``: choose each defense's setting on validation data; ``false``:
  the file's values).
* ``[[defenses]]`` may set ``rounds``: that defense's run length (its clean run must
  plateau within it; the file's ``rounds`` otherwise).
* ``[benchmark.quick]`` and ``[benchmark.subsets.<name>]``: profiles that narrow the
  run (``rounds``, ``seeds``, ``initial_seeds``, ``fractions``, ``attacks``,
  ``backdoors``, ``heterogeneity`` and ``defenses`` as label lists, ``tune``,
  ``racing``); ``--quick`` and ``--subset NAME`` select them.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from robust_pfl.config import config_error

#: Keys of the file the benchmark sets per cell.
PER_CELL = ("methods", "attack", "byzantine", "seeds")
ALL = "all"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def duplicated(labels: list[Any]) -> list[Any]:
    """The labels that appear more than once, sorted."""
    return sorted({label for label in labels if labels.count(label) > 1}, key=str)


def byzantine_shares(values: list[float]) -> list[float]:
    """``values`` as the benchmark's fractions: each a Byzantine share in [0, 0.5)
    (NaN is none), distinct, sorted; else ``ValueError`` naming them."""
    bad = [v for v in values if not 0 <= v < 0.5]
    if bad:
        raise ValueError(f"each must be a Byzantine share in [0, 0.5), got {bad}")
    if duplicated(values):
        raise ValueError(f"must be distinct, got {values}")
    return sorted(values)


class Profile(_Strict):
    """What ``--quick`` or ``--subset NAME`` narrows: each field left out keeps the
    file's value; the list fields name attacks, heterogeneity levels and defenses by
    label."""

    rounds: int | None = Field(None, ge=1)
    seeds: list[int] | None = Field(None, min_length=1)
    initial_seeds: int | None = Field(None, ge=1)
    racing: bool | None = None
    fractions: list[float] | None = Field(None, min_length=1, description="Byzantine shares of all clients, "
                                                                          "in [0, 0.5)")
    attacks: list[str] | None = Field(None, min_length=1)
    backdoors: list[str] | None = None
    heterogeneity: list[str] | None = Field(None, min_length=1)
    defenses: list[str] | None = Field(None, min_length=1)
    tune: bool | None = None

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, values: list[float] | None) -> list[float] | None:
        return None if values is None else byzantine_shares(values)


class Tolerance(_Strict):
    """How far below its clean accuracy a defense may fall and still hold: ``points``
    (absolute, in accuracy points) or ``share`` (of what the defense learned over
    chance, ``share * (clean - chance)``), one of the two."""

    points: float | None = Field(None, ge=0, le=100, description="accuracy points")
    share: float | None = Field(None, gt=0, le=1, description="share of clean accuracy minus chance")

    @model_validator(mode="after")
    def _one(self) -> Tolerance:
        if (self.points is None) == (self.share is None):
            raise ValueError("give one of 'points' or 'share'")
        return self

    def of(self, clean: float, chance: float) -> float:
        """The tolerance in accuracy units ([0, 1]) of a defense whose clean accuracy is
        ``clean`` (nan when a share of an unknown clean accuracy)."""
        if self.points is not None:
            return self.points / 100
        return self.share * max(clean - chance, 0.0)

    def text(self) -> str:
        return (f"{self.points:g} points" if self.points is not None
                else f"{self.share:g} of the clean accuracy above chance")


#: The default tolerance: a defense holds while it keeps four fifths of what it learned
#: over chance (docs/benchmark.md, "Verdicts").
DEFAULT_TOLERANCE = Tolerance(share=0.2)


class BenchmarkTable(_Strict):
    """The ``[benchmark]`` table (module docstring)."""

    fractions: list[float] = Field(min_length=1, description="Byzantine shares of all clients, in [0, 0.5)")
    attacks: Literal["all"] | list[str | dict[str, Any]] = ALL
    exclude_attacks: list[str] = Field(default_factory=list)
    backdoors: Literal["all"] | list[str | dict[str, Any]] = ALL
    heterogeneity: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"label": "as configured"}], min_length=1,
        description="task options per level, each with a label",
    )
    tolerance: Tolerance = Field(default_factory=lambda: DEFAULT_TOLERANCE,
                                 description="a number (points) or { points = p } or { share = s }")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="confidence of the intervals that decide")
    initial_seeds: int = Field(2, ge=1, description="seeds every run starts with (the file's seeds: the pool)")
    racing: bool = True
    candidate_attacks: int | None = Field(3, ge=1, description="the reference's worst surviving attacks the "
                                                               "candidates race on (None: every survivor)")
    plateau: float = Field(2.0, ge=0, le=100, description="points the clean validation accuracy may still climb "
                                                           "over the last quarter of a converged run")
    validation_per_client: int | None = Field(10, ge=1, description="validation samples per client of every "
                                                                    "level (None: the task's)")
    attack_options: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                      description="options per attack name")
    tune: bool = True
    quick: Profile = Field(default_factory=lambda: Profile(rounds=10, seeds=None, tune=False))
    subsets: dict[str, Profile] = Field(default_factory=dict)

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, values: list[float]) -> list[float]:
        shares = byzantine_shares(values)
        if not any(share > 0 for share in shares):  # a profile may narrow to the clean runs; the file may not
            raise ValueError(f"give at least one share > 0, got {values}: at 0 only the clean runs are made and "
                             "no attack is judged")
        return shares

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"points": float(value)}
        return value

    @field_validator("heterogeneity")
    @classmethod
    def _levels(cls, levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
        labels = [level.get("label") for level in levels]
        if not all(isinstance(label, str) and label for label in labels):
            raise ValueError(f"every level needs a non-empty string 'label', got labels {labels}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct, got {labels}")
        return levels


class Defense(BaseModel):
    """One ``[[defenses]]`` table: a method (``name``, ``label``, options) and its
    ``tune`` lists."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    label: str | None = None
    rounds: int | None = Field(None, ge=1, description="this defense's run length (default: the file's rounds)")
    tune: dict[str, list[Any]] | list[dict[str, Any]] = Field(default_factory=dict)

    @field_validator("tune")
    @classmethod
    def _tune(cls, tune: dict[str, list[Any]] | list[dict[str, Any]]) -> dict[str, list[Any]] | list[dict[str, Any]]:
        named = [key for table in (tune if isinstance(tune, list) else [tune]) for key in table]
        for key in named:
            if key in ("name", "label", "rounds"):
                raise ValueError(f"{key!r} is not a method option to tune")
        if isinstance(tune, list):
            distinct = {json.dumps(table, sort_keys=True) for table in tune}
            if not tune or len(distinct) != len(tune):
                raise ValueError(f"give distinct candidate tables, got {tune}")
            return tune
        for key, values in tune.items():
            if not values:
                raise ValueError(f"{key}: give at least one value")
            distinct = {json.dumps(v, sort_keys=True) for v in values}
            if len(distinct) != len(values):
                raise ValueError(f"{key}: values must be distinct, got {values}")
        return tune

    @property
    def display(self) -> str:
        return self.label or self.name

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def candidate_count(self) -> int:
        """How many candidates :meth:`candidates` gives when tuning, computed without
        making them (a product of lists can be huge)."""
        if isinstance(self.tune, list):
            return len(self.tune)
        return math.prod(len(values) for values in self.tune.values())

    def candidates(self, tune: bool) -> list[tuple[str, dict[str, Any]]]:
        """``(label, method table)`` of every candidate setting: the product of the
        ``tune`` lists (``tune``), else the file's values alone (label ``"as given"``);
        the *reference* candidate (:meth:`reference`) first, then the product's order."""
        base = {"name": self.name, "label": self.display, **self.options()}
        if not tune or not self.tune:
            return [("as given", base)]
        if isinstance(self.tune, list):
            tables = list(self.tune)
        else:
            keys = list(self.tune)
            tables = [dict(zip(keys, values)) for values in itertools.product(*(self.tune[key] for key in keys))]
        out = []
        for table in tables:
            label = ", ".join(f"{key}={compact(value)}" for key, value in table.items()) or "as given"
            out.append((label, {**base, **table}))
        first = self.reference_index(out, base)
        return [out[first], *out[:first], *out[first + 1:]]

    @staticmethod
    def reference_index(candidates: list[tuple[str, dict[str, Any]]], base: dict[str, Any]) -> int:
        """The candidate whose values are the file's own (the reference the attacks are
        raced at first), else the first of the product."""
        for index, (_, table) in enumerate(candidates):
            if table == base:
                return index
        return 0


def compact(value: Any) -> str:
    """A tuning value as a candidate's label shows it."""
    if isinstance(value, dict):
        return str(value.get("label") or json.dumps(value, sort_keys=True, separators=(",", ":")))
    return json.dumps(value) if not isinstance(value, str) else value


class BenchmarkSpec(_Strict):
    """A validated benchmark file: ``base`` (the run config every cell shares),
    ``defenses`` and ``benchmark``."""

    source: str
    base: dict[str, Any]
    defenses: list[Defense] = Field(min_length=1)
    benchmark: BenchmarkTable
    attack_labels: list[str] | None = None  # a profile's selection of the attacks, by label
    backdoor_labels: list[str] | None = None  # and of the backdoors

    @model_validator(mode="after")
    def _labels(self) -> BenchmarkSpec:
        labels = [d.display for d in self.defenses]
        if duplicated(labels):
            raise ValueError(f"defenses: labels must be distinct, got {labels} (set 'label')")
        return self

    def narrowed(self, profile: Profile, what: str) -> BenchmarkSpec:
        """This benchmark narrowed by ``profile`` (``what`` names it in errors; the
        file's profiles were checked at load, :mod:`robust_pfl.worst_case.checks`)."""
        table = self.benchmark
        known = {"defenses": [d.display for d in self.defenses],
                 "heterogeneity": [level["label"] for level in table.heterogeneity]}
        problems = [problem for field, labels in known.items()
                    if (problem := unknown_labels(f"{what}.{field}", getattr(profile, field), labels))]
        if problems:
            raise config_error(self.source, problems)
        defenses = [d for d in self.defenses if profile.defenses is None or d.display in profile.defenses]
        levels = [level for level in table.heterogeneity
                  if profile.heterogeneity is None or level["label"] in profile.heterogeneity]
        update: dict[str, Any] = {"heterogeneity": levels}
        if profile.fractions is not None:
            update["fractions"] = profile.fractions  # validated as the file's (Profile._fractions)
        for key in ("tune", "racing", "initial_seeds"):
            if getattr(profile, key) is not None:
                update[key] = getattr(profile, key)
        base = dict(self.base)
        quick = what.endswith("quick")
        if profile.rounds is not None:
            # the quick profile never lengthens a shorter run; a subset's rounds set every defense's
            cap = profile.rounds
            base["rounds"] = min(cap, base.get("rounds", 100)) if quick else cap
            defenses = [d.model_copy(update={"rounds": min(cap, d.rounds) if quick and d.rounds else None})
                        for d in defenses]
            longest = max([base["rounds"], *(d.rounds or 0 for d in defenses)])
            base["eval_every"] = max(1, min(base.get("eval_every", 10), longest // 4))
        if profile.seeds is not None:
            base["seeds"] = profile.seeds
        elif quick:
            base["seeds"] = base.get("seeds", [0])[:1]
        return self.model_copy(update={
            "base": base, "defenses": defenses, "benchmark": table.model_copy(update=update),
            "attack_labels": profile.attacks, "backdoor_labels": profile.backdoors,
        })

    @property
    def seeds(self) -> list[int]:
        return list(self.base.get("seeds", [0]))

    def rounds_of(self, defense: Defense) -> int:
        """``defense``'s run length: its own ``rounds``, else the file's."""
        return defense.rounds or self.base.get("rounds", 100)


def unknown_labels(where: str, chosen: Sequence[str] | None, known: Sequence[str]) -> Problem | None:
    """The problem of a profile's label list naming labels the file does not define."""
    unknown = [label for label in chosen or () if label not in known]
    return (where, f"unknown {unknown}; known: {list(known)}") if unknown else None


def cell_payload(spec: BenchmarkSpec, level: Mapping[str, Any], fraction: float, defense: Defense,
                 method: Mapping[str, Any], attack: Mapping[str, Any]) -> dict[str, Any]:
    """The run config of one combination, every seed: the file's base, the level's task
    options (and the benchmark's validation split, unless the task or level sets one),
    the defense's run length, the Byzantine fraction, the attack and the candidate
    method.  An attacked run evaluates at its start and end only: verdicts read its
    final metrics, and only the clean runs' curves (convergence)."""
    payload = copy.deepcopy(spec.base)
    task = {**payload.get("task", {}), **{k: v for k, v in level.items() if k != "label"}}
    if spec.benchmark.validation_per_client is not None:
        task.setdefault("validation_per_client", spec.benchmark.validation_per_client)
    payload["task"] = task
    payload["rounds"] = rounds = spec.rounds_of(defense)
    if fraction > 0:
        payload["byzantine"] = {"fraction": fraction}
        payload["eval_every"] = rounds  # only the clean runs' curves are read (convergence)
    payload["attack"] = copy.deepcopy(dict(attack))
    payload["methods"] = [copy.deepcopy(dict(method))]
    return payload
