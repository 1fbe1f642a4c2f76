"""Server rules that need more than the rows received this round: FLTrust (a root data
set held by the server) and FoolsGold (every client's history across rounds).

Both are algorithms built on :class:`defenses.baselines.Global`: one shared model, the
same batch stream, delivery, heavy-ball step, round records and adaptive-attack probe
(``defense_state["aggregate"]``); only the server's rule differs (Global's
``_rule`` / ``_aggregate`` hooks).  They are algorithms rather than
:class:`~defenses.aggregators.Aggregator` s because an aggregator is a pure
function of the received rows, and these are not:

* **FLTrust** (Cao, Fang, Liu, Gong, NDSS 2021, "FLTrust: Byzantine-robust federated
  learning via trust bootstrapping", Alg. 1-2, eq. 4) needs the server's own update
  ``g0``, a gradient of the same objective at the shared model on the server's root
  data set;
* **FoolsGold** (Fung, Yoon, Beschastnikh, RAID 2020, "The limitations of federated
  learning in sybil settings", Alg. 1) needs every client's aggregate historical
  update, so row ``i`` must be client ``i`` every round (it is: the federation's
  senders are all ``N`` clients in order).

Their state (FLTrust's root set and its batch stream; FoolsGold's ``[N, d]`` history)
is plain attributes, pickled with the algorithm into checkpoints.

The rules themselves are the batched functions :func:`fltrust_aggregate` and
:func:`foolsgold_weights` (messages ``[..., N, d]``, no loop over clients), so attacks
can probe them over leading dimensions.  Robustness follows
:mod:`defenses.aggregators`: a row with a NaN or infinite coordinate or an
overflowing squared norm is inadmissible and gets weight zero; a problem where every
weight is zero gets the zero update.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from defenses.base import AlgorithmParams, RoundWork, register
from defenses.baselines import Global
from robust_pfl.engine.rows import admissible_points, squared_norms
from defenses.aggregators import Aggregator, Rows
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.seeding import generator as make_generator
from robust_pfl.engine.types import RoundRecord

#: FLTrust's root data set size in the paper's experiments (Sec. 5.1: 100 samples).
PAPER_ROOT_SAMPLES = 100


def _safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` where the denominator is positive, else 0."""
    positive = denominator > 0
    return torch.where(positive, numerator / torch.where(positive, denominator, 1.0), 0.0)


# -- FLTrust ------------------------------------------------------------------------------------
def fltrust_aggregate(messages: Tensor, server: Tensor) -> tuple[Tensor, Tensor]:
    """FLTrust's aggregate (Cao et al., NDSS 2021, eq. 4) of ``messages[..., N, d]``
    given the server's update ``server[d]`` (or ``[..., d]``).

    Each client's trust score is ``TS_i = ReLU(cos(g_i, g0))``; its update is rescaled
    to the server's norm, ``g_i * ||g0|| / ||g_i||``; the aggregate is
    ``sum_i TS_i * rescaled_i / sum_j TS_j``.  Inadmissible rows and zero rows score
    0; where every score is 0 (or ``g0`` is zero or inadmissible) the aggregate is the
    zero update, not the server's own (the eq. 4 quotient is 0/0 there; a zero step
    is what the usual ``sum + eps`` implementations give, and it lets nothing through).

    Returns:
        ``(aggregate[..., d], trust_scores[..., N])``; the aggregate's norm is at most
        ``||g0||``, so it is finite whatever the rows hold.
    """
    values, admissible, _ = Rows.of(messages)
    server = torch.broadcast_to(server.to(messages.dtype), (*messages.shape[:-2], messages.shape[-1]))
    server_ok = admissible_points(server.unsqueeze(-2)).squeeze(-1)
    server_values = torch.where(server_ok.unsqueeze(-1), server, torch.zeros_like(server))
    server_norm = squared_norms(server_values).sqrt()  # [...]
    # cosines through unit vectors: no product of two norms can overflow
    server_unit = _safe_divide(server_values, server_norm.unsqueeze(-1))
    norms = squared_norms(values).sqrt()  # [..., N], finite for admissible rows
    projections = (values @ server_unit.unsqueeze(-1)).squeeze(-1)  # [..., N], |.| <= norms
    cosines = _safe_divide(projections, norms).clamp(-1.0, 1.0)
    scores = torch.where(admissible, torch.relu(cosines), 0.0)
    total = scores.sum(-1, keepdim=True)  # [..., 1]
    # sum_i TS_i g_i / ||g_i||: each term has norm TS_i, so the sum has norm <= total
    directions = (_safe_divide(scores, norms).unsqueeze(-2) @ values).squeeze(-2)
    aggregate = _safe_divide(directions, total) * server_norm.unsqueeze(-1)
    return aggregate, scores


class FLTrustParams(AlgorithmParams):
    root_samples: int | None = Field(
        None, ge=1,
        description="size of the server's root data set, drawn once (seeded stream 'fltrust-root') "
        "without replacement from the honest clients' pooled training samples; unset: the paper's 100, "
        "or the whole pool when it is smaller",
    )


@register
class FLTrust(Global):
    """FLTrust (Cao, Fang, Liu, Gong, NDSS 2021, Alg. 1-2 with eq. 4): FedAvg whose
    server holds a small clean *root data set* and trusts each client by the cosine
    between its update and the server's own.

    Each round the server computes ``g0``, the gradient of the task's objective at the
    shared model on a batch of its root set (the clients' batch size, drawn from the
    seeded stream ``"fltrust-root-batches"``; the full root set when the batch size is
    None or larger); the clients' gradients at the same model are delivered as in
    ``global``; the update is :func:`fltrust_aggregate` of them given ``g0`` (zero when
    every trust score is zero), applied with the heavy-ball step.  Clients take one
    gradient step per round here, so ``g0`` is one gradient too (the paper's ``R``
    local iterations with ``R = 1``).

    *Root data set.*  The paper's root set is a small clean set the server collects
    from the learning task's distribution (its experiments: 100 samples by default,
    drawn from the training data).  Here it is ``root_samples`` samples drawn once, at
    construction, without replacement from the pooled training samples of the honest
    clients (so a data attack's poisoned samples never enter it); they stay in those
    clients' own sets too (no held-out split: the task and federation are unchanged).
    On a clustered task the pool mixes every cluster.
    The root set stays fixed if the federation re-deals its data.  The server's
    gradients are counted in ``federation.sample_gradients``.

    ``records``: ``extras["trust"]`` the ``[N]`` trust scores, ``extras["server_update"]``
    ``g0``.
    """

    name = "fltrust"

    flower = False

    flower_node_attacks = False
    summary = "FLTrust: client updates weighted by ReLU(cos) with the server's root-data gradient, rescaled to its norm"
    reference = "Cao, Fang, Liu, Gong, NDSS 2021, FLTrust: Byzantine-robust FL via trust bootstrapping, Alg. 1-2, eq. 4"
    Params = FLTrustParams

    def __init__(self, federation: Federation, params: FLTrustParams) -> None:
        super().__init__(federation, params)
        self.root = self._draw_root(federation, params.root_samples)
        self._root_rng = federation.rng("fltrust-root-batches")
        self.server_update: Tensor | None = None
        self.trust: Tensor | None = None

    def _make_aggregator(self, params: AlgorithmParams, clients: int) -> Aggregator | None:
        return None

    @classmethod
    def round_work(cls, params: FLTrustParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """One gradient per client and the server's one (about a client's batch), and
        a few passes over the received vectors."""
        return RoundWork(gradients_per_client=1.0 + 1.0 / max(clients, 1), vector_passes=4.0 * clients + 4.0)

    @staticmethod
    def _draw_root(federation: Federation, requested: int | None) -> ClientData:
        """The root set ``[1, m, ...]``: ``m`` samples drawn without replacement from the
        honest clients' pooled training samples (seeded stream ``"fltrust-root"``,
        drawn on the CPU: the same samples on every device)."""
        train = federation.train
        honest = federation.honest.nonzero().squeeze(-1)
        per_client = train.samples_per_client
        pool = int(honest.numel()) * per_client
        if requested is not None and requested > pool:
            raise ValueError(
                f"root_samples: the server's root set is drawn from the honest clients' {pool} training samples "
                f"({int(honest.numel())} clients x {per_client}); got root_samples={requested}"
            )
        size = min(PAPER_ROOT_SAMPLES, pool) if requested is None else requested
        if size < 1:
            raise ValueError("root_samples: the root set needs honest clients' training samples; the federation has none")
        picked = torch.randperm(pool, generator=make_generator(federation.seed, "fltrust-root"))[:size]
        picked = picked.to(train.inputs.device)
        clients, samples = honest[picked // per_client], picked % per_client
        return ClientData(train.inputs[clients, samples].unsqueeze(0), train.targets[clients, samples].unsqueeze(0))

    def _server_gradient(self) -> Tensor:
        """``g0``: the objective's gradient at the shared model on a root batch, ``[d]``."""
        batch = self.root.sample(self.federation.batch_size, self._root_rng)
        return self.federation.gradients(self.model, batch)[0]

    def _rule(self, messages: Tensor, generator: torch.Generator) -> Tensor:
        return fltrust_aggregate(messages, self.server_update)[0]

    def _aggregate(self, received: Tensor) -> Tensor:
        update, self.trust = fltrust_aggregate(received, self.server_update)
        return update

    def step(self, round_index: int) -> RoundRecord:
        self.server_update = self._server_gradient()
        record = super().step(round_index)
        record.extras["trust"] = self.kept(self.trust)
        record.extras["server_update"] = self.kept(self.server_update)
        return record


# -- FoolsGold ----------------------------------------------------------------------------------
def foolsgold_weights(histories: Tensor, confidence: float = 1.0) -> Tensor:
    """FoolsGold's learning-rate weights (Fung et al., RAID 2020, Alg. 1, without the
    optional feature-importance weighting) of the clients' aggregate historical updates
    ``histories[..., N, d]``: ``[..., N]`` in ``[0, 1]``.

    As the authors' code does: ``cs_ij`` is the cosine similarity of ``H_i`` and
    ``H_j`` with the diagonal set to 0 (``cos - I``); ``v_i = max_j cs_ij``;
    *pardoning*: ``cs_ij *= v_i / v_j`` where ``v_j > v_i``; ``alpha_i = 1 - max_j
    cs_ij`` clipped to ``[0, 1]``; rescaled so that the largest is 1, which becomes
    0.99; the *logit* ``kappa (ln(alpha / (1 - alpha)) + 0.5)`` (``kappa`` =
    ``confidence``) clipped to ``[0, 1]``.

    An inadmissible history (NaN, Inf, overflowing squared norm) has weight 0 and
    similarity 0 to every other; so does a zero history's similarity.  Where every
    ``alpha`` is 0 (each client has an exact twin) all weights are 0 (the rescaling's
    0/0).
    """
    values, admissible, _ = Rows.of(histories)
    units = _safe_divide(values, squared_norms(values).sqrt().unsqueeze(-1))
    n = histories.shape[-2]
    eye = torch.eye(n, dtype=torch.bool, device=histories.device)
    similarity = torch.where(eye, 0.0, units @ units.transpose(-1, -2))  # [..., N, N]
    best = similarity.amax(-1) if n else similarity.sum(-1)  # v_i >= 0 (the diagonal)
    own, other = best.unsqueeze(-1), best.unsqueeze(-2)  # v_i down the rows, v_j across
    pardoned = torch.where(other > own, similarity * _safe_divide(own, other), similarity)
    alpha = (1.0 - (pardoned.amax(-1) if n else pardoned.sum(-1))).clamp(0.0, 1.0)
    alpha = torch.where(admissible, alpha, 0.0)
    top = alpha.amax(-1, keepdim=True) if n else alpha.sum(-1, keepdim=True)
    alpha = _safe_divide(alpha, top)
    alpha = torch.where(alpha == 1.0, torch.full_like(alpha, 0.99), alpha)
    logit = confidence * (torch.log(alpha / (1.0 - alpha)) + 0.5)  # -inf where alpha = 0
    weights = torch.where(logit > 1.0, 1.0, logit)
    return torch.where(logit > 0.0, weights, 0.0)  # negative, -inf (and no NaN) -> 0


def foolsgold_aggregate(messages: Tensor, history: Tensor, confidence: float = 1.0) -> tuple[Tensor, Tensor]:
    """FoolsGold's aggregate of this round's ``messages[..., N, d]`` given the clients'
    history before it, ``history[N, d]`` (row ``i`` is client ``i``): the weights of
    :func:`foolsgold_weights` of ``history + messages`` (Alg. 1 adds this round's update
    first) give the weighted mean ``sum_i w_i g_i / sum_i w_i`` of the admissible rows
    (zero where every weight is zero).

    The authors' code applies the weighted *sum* (each weight scales a client's
    learning rate, so the step grows with the number of clients); the weighted mean
    keeps the step on the scale of ``global``'s mean, so one learning rate serves both.

    Returns:
        ``(aggregate[..., d], weights[..., N])``.
    """
    values, admissible, _ = Rows.of(messages)
    weights = torch.where(admissible, foolsgold_weights(history + messages, confidence), 0.0)
    total = weights.sum(-1, keepdim=True)
    aggregate = (weights.unsqueeze(-2) @ values).squeeze(-2)
    return _safe_divide(aggregate, total), weights


class FoolsGoldParams(AlgorithmParams):
    confidence: float = Field(
        1.0, gt=0, description="kappa, the confidence parameter that scales FoolsGold's logit (Alg. 1)"
    )


@register
class FoolsGold(Global):
    """FoolsGold (Fung, Yoon, Beschastnikh, RAID 2020, "The limitations of federated
    learning in sybil settings", Alg. 1): FedAvg whose server keeps every client's
    aggregate historical update ``H_i = sum_t g_i,t`` and down-weights clients whose
    histories are alike (sybils pushing one goal), by :func:`foolsgold_weights`.

    Each round the clients' gradients at the shared model are delivered as in
    ``global``; the weights come from the histories with this round's rows added; the
    update is :func:`foolsgold_aggregate`'s weighted mean, applied with the heavy-ball
    step; then the histories take this round's rows.  A client that sends a
    non-finite or overflowing row has an inadmissible history from then on (weight 0)
    unless later rows bring it back to finite.  The optional feature-importance
    weighting of the paper (Sec. 5) is left out.

    ``records``: ``extras["weights"]`` the ``[N]`` weights of the round.
    """

    name = "foolsgold"

    flower = False

    flower_node_attacks = False
    summary = "FoolsGold: weighted mean, clients with alike update histories (sybils) down-weighted"
    reference = "Fung, Yoon, Beschastnikh, RAID 2020, The limitations of federated learning in sybil settings, Alg. 1"
    Params = FoolsGoldParams

    def __init__(self, federation: Federation, params: FoolsGoldParams) -> None:
        super().__init__(federation, params)
        self.history = self.model.new_zeros(federation.clients, self.model.shape[-1])
        self.weights: Tensor | None = None

    def _make_aggregator(self, params: AlgorithmParams, clients: int) -> Aggregator | None:
        return None

    @classmethod
    def round_work(cls, params: FoolsGoldParams, clients: int, task_clusters: int, model_dim: int) -> RoundWork:
        """One gradient per client; the ``N x N`` similarities of the histories and a
        few passes over the received vectors."""
        return RoundWork(gradients_per_client=1.0, vector_passes=float(clients) * clients + 6.0 * clients)

    def _rule(self, messages: Tensor, generator: torch.Generator) -> Tensor:
        return foolsgold_aggregate(messages, self.history, self.params.confidence)[0]

    def _aggregate(self, received: Tensor) -> Tensor:
        update, self.weights = foolsgold_aggregate(received, self.history, self.params.confidence)
        self.history += received
        return update

    def step(self, round_index: int) -> RoundRecord:
        record = super().step(round_index)
        record.extras["weights"] = self.kept(self.weights)
        return record


__all__ = [
    "FLTrust", "FLTrustParams", "FoolsGold", "FoolsGoldParams", "fltrust_aggregate", "foolsgold_aggregate",
    "foolsgold_weights",
]
