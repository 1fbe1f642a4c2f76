"""The round interface every personalised-FL algorithm implements, and its registry.

The machinery algorithms build on lives apart: the optimiser step in
:mod:`defenses.optimiser`, reused round memory in :mod:`defenses.round_buffers`, the
row statistics in :mod:`robust_pfl.engine.rows` (shared with the attacks).

An algorithm is constructed from a :class:`~robust_pfl.engine.federation.Federation` and its
validated parameters (a pydantic model, so a bad value fails at config-load time with
the field's name), then stepped round by round::

    algo = REGISTRY["fc"](federation, FederatedClustering.Params(lr=0.01))
    for t in range(T):
        record = algo.step(t)          # a RoundRecord: gradients, updates, clusters
    models = algo.client_models()      # [N, d] personalised models
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from defenses.aggregators import AGGREGATORS, PRE_AGGREGATORS
from robust_pfl.engine import defense_state
from robust_pfl.engine.defense_state import PublishedState
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.registry import did_you_mean, registrar
from robust_pfl.engine.types import RoundRecord


class AlgorithmParams(BaseModel):
    """Parameters shared by all algorithms: learning rate and heavy-ball momentum on
    the applied update (the official code uses 0.9: ``m = mu m + v; x -= lr m``).
    Every number an algorithm takes is finite: an infinite learning rate, penalty or
    temperature is refused at load rather than run as a model that never moves."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    lr: float = Field(0.01, gt=0, description="learning rate eta")
    heavy_ball: float = Field(0.0, ge=0, lt=1, description="heavy-ball momentum on the update")

    #: Values of fields added after checkpoints were written whose default does not
    #: reproduce those runs: a checkpoint without such a field resumes with this value
    #: (every other missing field takes its default).
    values_before_the_field_existed: ClassVar[dict[str, Any]] = {}


class Algorithm(ABC):
    """Base class: one round of a (personalised) federated algorithm.

    A subclass declares, as class attributes:

    * ``name`` (required): the registry key a config names it by;
    * ``summary`` (required): one line for ``robust-pfl methods``;
    * ``reference``: the paper and algorithm it implements (default ``""``);
    * ``Params``: its pydantic parameter model, a subclass of :class:`AlgorithmParams`
      (default :class:`AlgorithmParams`: ``lr`` and ``heavy_ball``);
    * ``forms_clusters``: its records carry a cluster assignment (default False);
    * ``sends_momenta``: its clients send momenta, which its records carry in
      ``RoundRecord.momenta`` (what the ``[theory]`` table's ``momentum`` estimate
      reads; default False);
    * ``requires_classification``: it needs a classification task (KNN-Per's vote
      over labels; default False);
    * ``predict_log_proba``: a method when its clients predict by more than their model
      (default None);
    * ``flower``, ``flower_node_attacks``: what the Flower adapter can wrap (default
      False: not wrapped);
    * ``published_state``: what it passes to ``deliver`` as ``defense_state`` for
      adaptive attacks, a :class:`~robust_pfl.engine.defense_state.PublishedState`
      (default: nothing; :func:`defenses.check_algorithm` checks a short run against it);

    and implements the two abstract methods :meth:`step` and :meth:`client_models`.
    An algorithm whose state is more than its attributes' pickles (none so far) must
    make them pickle, since a checkpoint is the pickled algorithm.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    reference: ClassVar[str] = ""
    Params: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    forms_clusters: ClassVar[bool] = False
    sends_momenta: ClassVar[bool] = False
    requires_classification: ClassVar[bool] = False
    #: ``predict_log_proba(inputs)`` for an algorithm whose clients predict by more than
    #: their model (KNN-Per's vote over neighbours), which evaluation then uses; None:
    #: each client's model predicts.
    predict_log_proba: ClassVar[Callable[[Tensor], Tensor] | None] = None
    #: The Flower adapter (:mod:`robust_pfl.flower`) can run it: all of its client work
    #: is ``Federation.gradients`` / ``cross_gradients`` / loss requests (one vector per
    #: model a node evaluates) and its state lives on the server.
    flower: ClassVar[bool] = False
    #: Under Flower, a Byzantine node may attack its own reply: the message is the
    #: gradient the node computes (or linear in it).  Otherwise (uploads made by several
    #: local steps) the strategy replaces the Byzantine uploads through ``deliver``.
    flower_node_attacks: ClassVar[bool] = False
    #: The keys it publishes to adaptive attacks, declared where ``attacks`` can read
    #: them (:mod:`robust_pfl.engine.defense_state`; docs/extending.md's reference).
    published_state: ClassVar[PublishedState] = defense_state.NOTHING

    def __init__(self, federation: Federation, params: AlgorithmParams) -> None:
        if not isinstance(params, self.Params):
            raise TypeError(f"{self.name} expects {self.Params.__name__}, got {type(params).__name__}")
        self.federation = federation
        self.params = params
        #: Records returned by :meth:`step` hold private copies, safe to keep across
        #: rounds.  A runner that reads each record only within its round may turn
        #: this off; algorithms then hand out the buffers they reuse next round and
        #: may leave out what they never materialise (MC's gradients, blended into
        #: the momenta as they are produced).
        self.snapshot_records = True

    @classmethod
    def reported_loss_models(cls, params: AlgorithmParams, task_clusters: int) -> int | None:
        """On how many models its clients report losses (messages of kind ``"loss"``,
        which a loss-forging attack replaces) with ``params`` on a task of
        ``task_clusters`` clusters; None (the default) when they report none.  Read at
        config load, before any federation exists."""
        return None

    @classmethod
    def round_work(cls, params: AlgorithmParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """What one round costs with ``params`` among ``clients`` clients on a task of
        ``task_clusters`` clusters and a model of ``model_dim`` parameters: by default
        one gradient per client and a few passes over every client's vector (an
        aggregation).  Read at config load for
        the run's cost estimate (:mod:`robust_pfl.costs`)."""
        return RoundWork(gradients_per_client=1.0, vector_passes=4.0 * clients)

    @classmethod
    def with_run_budgets(
        cls, params: AlgorithmParams, byzantine: int, clients: int
    ) -> tuple[AlgorithmParams, list[tuple[str, str]]]:
        """``params`` with every unset Byzantine budget set to the run's ``byzantine``
        count (of ``clients`` clients), and ``(field, message)`` for each budget given
        below it (kept, and warned at load).  A method whose robust rule aggregates
        subgroups sets each group's budget from the groups' sizes.  Default: no budget,
        ``params`` unchanged.  Read at config load, before any federation exists."""
        return params, []

    @classmethod
    def client_count_problems(cls, params: AlgorithmParams, clients: int) -> list[tuple[str, str]]:
        """``(field, message)`` for each option of ``params`` that ``clients`` clients
        cannot serve (FC's ``groups`` past N); none by default.  Read at config load."""
        return []

    @abstractmethod
    def step(self, round_index: int) -> RoundRecord:
        """Run round ``round_index`` (0-based) of the algorithm on the federation.

        Args:
            round_index: the round, which the federation's attack and batch streams
                are keyed by.

        Returns:
            The round's :class:`~robust_pfl.engine.types.RoundRecord`: at least the honest
            clients' gradients (or ``None`` where never materialised, see
            :attr:`snapshot_records`) and the applied updates; with
            ``forms_clusters``, the cluster assignment.
        """

    @abstractmethod
    def client_models(self) -> Tensor:
        """The personalised model of every client, ``[N, d]`` (Byzantine rows
        included; metrics read the honest ones)."""

    def kept(self, tensor: Tensor | None) -> Tensor | None:
        """``tensor`` as a record may hold it: a copy when :attr:`snapshot_records`."""
        return tensor.clone() if self.snapshot_records and tensor is not None else tensor

    def per_client(self, cluster_rows: Tensor, assignment: Tensor) -> Tensor | None:
        """A record's per-client rows ``cluster_rows[assignment]`` when records are
        snapshots; without snapshots ``None`` (an ``[N, d]`` gather that nothing in a
        run reads: the record's ``cluster_updates`` give them, see :class:`RoundRecord`)."""
        return cluster_rows[assignment] if self.snapshot_records else None


@dataclass(frozen=True)
class RoundWork:
    """One round of an algorithm, counted in model-sized vectors: the gradients each
    client evaluates (FC: one at every model of its group) and the passes over a
    ``d``-vector that aggregation makes, all clients together (Threshold-Clustering:
    rounds x centres x points)."""

    gradients_per_client: float
    vector_passes: float
    #: Operations beyond the passes, e.g. a robust aggregator's (MDA's subset search).
    extra_flops: float = 0.0
    #: Steps run one after another within a round, each a few kernel launches whatever
    #: the sizes (Threshold-Clustering's rounds).
    serial_steps: float = 0.0


REGISTRY: dict[str, type[Algorithm]] = {}


register = registrar(REGISTRY, "algorithm")


#: Method names of the literature that are ``global`` with an aggregator (FedAvg:
#: Global's default ``mean``), for the hint an unknown method name gets.
METHOD_ALIASES = {"fedavg": "global", "fedsgd": "global"}


def unknown_method(name: str) -> str:
    """What is said of a method name no algorithm registered: the one wording a config
    load and :func:`build` share.  Besides the closest registered name, the hint says
    that FedAvg, a robust aggregator's or a pre-aggregator's name is ``global`` with
    that aggregator (a name from the papers that is not a method here)."""
    return f"unknown method {name!r}{_method_hint(name)}; allowed: {sorted(REGISTRY)}"


def _method_hint(name: str) -> str:
    lowered = str(name).lower()
    if lowered in METHOD_ALIASES:
        return (f" ({name!r} is {METHOD_ALIASES[lowered]!r}: one shared model, its default aggregator "
                "'mean' is FedAvg's)")
    if lowered in AGGREGATORS:
        return f" ({lowered!r} is a robust aggregator: name = 'global' with aggregator = '{lowered}')"
    if lowered in PRE_AGGREGATORS:
        return (f" ({lowered!r} is a pre-aggregator: name = 'global' with "
                f"aggregator = {{name = 'mean', pre = ['{lowered}']}})")
    return did_you_mean(name, REGISTRY)


def build(name: str, federation: Federation, options: Mapping[str, Any] | None = None,
          params: AlgorithmParams | None = None) -> Algorithm:
    """Construct a registered algorithm from plain options (validated), or from its
    ``params`` where a config's validation built them already."""
    if name not in REGISTRY:
        raise ValueError(unknown_method(name))
    cls = REGISTRY[name]
    return cls(federation, cls.Params(**dict(options or {})) if params is None else params)
