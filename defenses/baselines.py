"""Reference baselines of Werner et al. Sec. 4: Local, Global (FedAvg, optionally with a
classic robust aggregator) and GroundTruth (oracle clusters)."""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field, PlainValidator
from torch import Tensor

from defenses.base import Algorithm, AlgorithmParams, RoundWork, register
from defenses.optimiser import HeavyBall
from defenses.primitives import group_mean
from defenses.aggregators import Aggregator, make_aggregator
from defenses.round_buffers import RoundBuffers
from robust_pfl.engine import defense_state
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.types import RoundRecord


@register
class Local(Algorithm):
    """Every client runs SGD on its own data alone: ``x_i -= eta * g_i(x_i)``."""

    name = "local"
    published_state = defense_state.NOTHING

    flower = True

    flower_node_attacks = True
    summary = "each client trains alone on its own data"

    def __init__(self, federation: Federation, params: AlgorithmParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clients, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self._round = RoundBuffers()

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        grads = self._round.own_gradients(fed, self.models, fed.sample_batch(reuse=True))
        self.optimizer.apply(self.models, grads)
        grads = self.kept(grads)
        return RoundRecord(round_index, gradients=grads, updates=grads)

    def client_models(self) -> Tensor:
        return self.models


def built_aggregator(value: Any) -> Aggregator:
    """``value`` as an :class:`Aggregator`: a config's spec (a name or a table) built
    once, here, and carried as the object; an aggregator is kept as it is."""
    if isinstance(value, Aggregator):
        return value
    if not isinstance(value, (str, dict)):
        raise ValueError(f"must be a string or a table, got {value!r}")
    return make_aggregator(value)


class GlobalParams(AlgorithmParams):
    aggregator: Annotated[Aggregator, PlainValidator(built_aggregator)] = Field(
        "mean",
        validate_default=True,
        description="how the server combines the received gradients: a name (mean, median, "
        "trimmed_mean, krum, ...) or {name = ..., options}; see defenses.aggregators",
    )


@register
class Global(Algorithm):
    """FedAvg with gradient averaging: one shared model, ``x -= eta * agg_j g_j(x)``.

    ``agg`` is ``params.aggregator``: the default ``mean`` (over all received
    gradients, Byzantine ones included; only non-finite or overflowing rows are
    dropped) is the undefended baseline of Fig. 6; a robust aggregator (median,
    trimmed mean, Krum, geometric median, centered clipping, bucketing) makes it the
    classic Byzantine-robust, non-personalised baseline.  The aggregator gets the
    previous round's aggregate (centered clipping starts there) and its own seeded
    stream ``"global-aggregator"`` (bucketing's permutations).  Adaptive attacks can
    probe it through ``defense_state["aggregate"]``: messages ``[..., N, d]`` ->
    ``[..., 1, d]``, drawn with the random numbers the server is about to use (a copy
    of its stream: probing never changes the run).
    """

    name = "global"
    published_state = defense_state.AGGREGATE

    flower = True

    flower_node_attacks = True
    summary = "one shared model; received gradients combined by `aggregator` (default mean: FedAvg)"
    Params = GlobalParams

    @classmethod
    def with_run_budgets(
        cls, params: AlgorithmParams, byzantine: int, clients: int
    ) -> tuple[AlgorithmParams, list[tuple[str, str]]]:
        """The aggregator's unset budgets (its own, an inner one's, its pre-aggregators')
        set to the run's Byzantine count: the server aggregates all ``clients``, of
        which ``byzantine`` are Byzantine."""
        if not isinstance(params, GlobalParams):  # a subclass with a rule of its own
            return params, []
        shortfalls = params.aggregator.budget_shortfalls(byzantine, clients, "aggregator")
        return params.model_copy(update={"aggregator": params.aggregator.with_run_budget(byzantine)}), shortfalls

    @classmethod
    def client_count_problems(cls, params: AlgorithmParams, clients: int) -> list[tuple[str, str]]:
        """The aggregator's own refusal of ``clients`` senders (Krum's ``n > 2f + 2``)."""
        if not isinstance(params, GlobalParams):  # a subclass with a rule of its own
            return []
        try:
            params.aggregator.check(clients)
        except ValueError as error:
            return [("aggregator", str(error))]
        return []

    @classmethod
    def round_work(cls, params: GlobalParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """One gradient per client, a few passes over the received vectors, and the
        aggregator's own work (:meth:`defenses.Aggregator.flops`)."""
        return RoundWork(1.0, 4.0 * clients, extra_flops=params.aggregator.flops(clients, model_dim))

    def __init__(self, federation: Federation, params: GlobalParams) -> None:
        super().__init__(federation, params)
        self.aggregator = self._make_aggregator(params, federation.clients)
        self.model = federation.init_params(1)
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.model)
        self.previous: Tensor | None = None
        self._rng = federation.rng("global-aggregator")
        self._round = RoundBuffers()

    # -- the server's rule: what a subclass with a rule of its own overrides ------------------
    def _make_aggregator(self, params: AlgorithmParams, clients: int) -> Aggregator | None:
        """The robust aggregator of ``params.aggregator``, checked against ``clients``
        senders; a subclass whose server rule is not an :class:`Aggregator` (FLTrust,
        FoolsGold: :mod:`defenses.trust_aggregation`) returns None and overrides
        :meth:`_rule`."""
        params.aggregator.check(clients)
        return params.aggregator

    def _rule(self, messages: Tensor, generator: torch.Generator) -> Tensor:
        """The aggregate of ``messages[..., N, d]``, ``[..., d]``, a pure function of
        them and the algorithm's state (adaptive attacks probe it)."""
        return self.aggregator(messages, self.previous, generator)

    def _aggregate(self, received: Tensor) -> Tensor:
        """This round's aggregate ``[d]`` of the received ``[N, d]``, drawing from the
        server's stream; a rule with state across rounds updates it here."""
        return self._rule(received, self._rng)

    def _probe(self, messages: Tensor) -> Tensor:
        """The aggregate the server would compute from ``messages``, ``[..., 1, d]``."""
        copy = torch.Generator(device=self._rng.device)
        copy.set_state(self._rng.get_state())
        return self._rule(messages, copy).unsqueeze(-2)

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        shared = self.model.expand(fed.clients, -1)
        grads, received = self._round.delivered_gradients(
            fed, shared, fed.sample_batch(reuse=True), round_index, {"aggregate": self._probe}
        )
        update = self._aggregate(received).unsqueeze(0)
        self.previous = update[0]
        self.optimizer.apply(self.model, update)
        return RoundRecord(round_index, gradients=self.kept(grads), updates=update.expand(fed.clients, -1))

    def client_models(self) -> Tensor:
        return self.model.expand(self.federation.clients, -1)


class GroundTruthParams(AlgorithmParams):
    exclude_byzantine: bool = Field(
        True, description="the oracle also knows who is Byzantine and leaves them out"
    )


@register
class GroundTruth(Algorithm):
    """Oracle clusters: one model per true cluster, updated with the mean gradient of
    that cluster's clients (GT in Werner et al. Fig. 3 and Table 1)."""

    name = "ground_truth"
    published_state = defense_state.GROUND_TRUTH

    flower = True

    flower_node_attacks = True
    summary = "oracle clusters: FedAvg within each true cluster"
    Params = GroundTruthParams
    forms_clusters = True

    def __init__(self, federation: Federation, params: GroundTruthParams) -> None:
        super().__init__(federation, params)
        self.models = federation.init_params(1).expand(federation.clusters, -1).clone()
        self.optimizer = HeavyBall(params.lr, params.heavy_ball, self.models)
        self._round = RoundBuffers()

    def step(self, round_index: int) -> RoundRecord:
        fed = self.federation
        at_own_cluster = self._round.gather(self.models, fed.cluster_ids)
        include = fed.honest if self.params.exclude_byzantine else None

        def aggregate(messages: Tensor) -> Tensor:
            return group_mean(messages, fed.cluster_ids, fed.clusters, include)[0][..., fed.cluster_ids, :]

        grads, received = self._round.delivered_gradients(
            fed, at_own_cluster, fed.sample_batch(reuse=True), round_index, {"aggregate": aggregate}
        )
        means, sizes = group_mean(received, fed.cluster_ids, fed.clusters, include)
        active = sizes > 0
        self.optimizer.apply(self.models, means[active], rows=active.nonzero().squeeze(-1))
        return RoundRecord(
            round_index, gradients=self.kept(grads), updates=self.per_client(means, fed.cluster_ids),
            assignment=fed.cluster_ids, cluster_updates=means,
        )

    def client_models(self) -> Tensor:
        return self.models[self.federation.cluster_ids]
