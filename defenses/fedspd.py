"""FedSPD (Lin, Yagin, Joe-Wong, UAI 2025): personalised decentralised FL by soft
clustering on a communication graph.

Each client holds ``S`` cluster centres (models) and a cluster label for every one of
its data points; its mixture weights ``u_is`` are the label fractions.  One round
(Alg. 1, Sec. 4 steps 1-4):

1. **local training**: client i draws one cluster ``s_i ~ u_i`` and runs ``tau`` SGD
   steps on its centre ``c_{i s_i}`` with batches of its points labelled ``s_i``;
2. **exchange**: it sends ``(s_i, c_{i s_i})`` to its graph neighbours;
3. **centre update** (eq. 1, Alg. 1 line 24): ``C_s <- W_s C_s`` for every cluster,
   mixing only the centres of the clients that trained ``s``;
4. **data clustering**: every point is relabelled to its lowest-loss centre, and
   ``u_is`` becomes the fraction of points labelled ``s``.

The personalised model (Alg. 1 ``FINALPHASE``) is ``x_i = sum_s u_is c_is`` (eq. 2)
followed by ``finetune_steps`` local gradient steps on all of client i's data.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor
from torch.func import vmap

from defenses.base import Algorithm, AlgorithmParams, register
from defenses.graph_rounds import received_from_neighbours, receiver_chunks
from defenses.optimiser import HeavyBall
from robust_pfl.engine import defense_state
from robust_pfl.engine.rows import admissible_points
from robust_pfl.engine.data import Batch, ClientData
from robust_pfl.engine.devices import memory_budget_mb, same_device
from robust_pfl.engine.federation import Federation
from robust_pfl.engine.graphs import Graph, GraphSpec, MixingRule, federation_graph
from robust_pfl.engine.objectives import Objective, loss_from_outputs
from robust_pfl.engine.types import RoundRecord


def _default_graph() -> GraphSpec:
    # connected with high probability at small N (redrawn until connected anyway)
    return GraphSpec(kind="erdos_renyi", p=0.3)


FEDSPD_CPU_BUDGET_MB = 256


class FedSPDParams(AlgorithmParams):
    lr: float = Field(0.05, gt=0, description="initial learning rate eta_0 of the local SGD steps (paper: 0.05)")
    lr_decay: float = Field(
        1.0, gt=0, le=1, description="factor applied to the learning rate every lr_decay_every rounds (paper: 0.8)"
    )
    lr_decay_every: int = Field(
        10, ge=1, description="rounds between two learning-rate decays (the paper does not say)"
    )
    graph: GraphSpec = Field(
        default_factory=_default_graph,
        description="communication graph; weights: uniform (the paper's experiments) or metropolis "
        "(doubly stochastic, as its proof assumes); the paper: erdos_renyi p = 0.06 at N = 100",
    )
    centres: int = Field(2, ge=1, description="S: cluster centres per client (paper: 2)")
    local_steps: int = Field(5, ge=1, description="tau: local SGD steps on the chosen centre per round")
    double_first_round: bool = Field(
        True, description="round 0 runs 2 tau local steps (App. B.1: 'the initial step having double the local epochs')"
    )
    centre_init: Literal["independent", "shared"] = Field(
        "shared",
        description="initial centres, the same at every client: one draw for all S with uniformly random "
        "initial labels (shared), or S independent draws with lowest-loss initial labels (independent)",
    )
    finetune_steps: int = Field(
        5, ge=0, description="final-phase local gradient steps from sum_s u_is c_is (Alg. 1 FINALPHASE; 0: none)"
    )
    finetune_lr: float | None = Field(
        None, gt=0, description="step size of the final phase (default: the current learning rate)"
    )
    finetune_batch: int | None = Field(
        None, ge=1, description="samples per final-phase step (default: all of the client's data, as Alg. 1 line 42)"
    )
    budget_mb: float | None = Field(
        None,
        gt=0,
        description=f"memory for the messages received at once, receivers chunked to fit (default: "
        f"{FEDSPD_CPU_BUDGET_MB} on the CPU, a quarter of the free memory on CUDA)",
    )


@register
class FedSPD(Algorithm):
    """FedSPD (Lin, Yagin, Joe-Wong 2025, Alg. 1; eq. 1 and 2).

    State: ``centres[S, N, d]`` (client i's estimate of cluster s is ``centres[s, i]``),
    ``labels[N, n]`` (every training point's cluster) and the mixture weights
    ``weights[N, S]`` (label fractions).  Clients are a batch dimension throughout.

    * **Initialisation** (the paper is silent): every client starts from the same
      ``S`` centres (a shared seed, which also rules out the label switching the paper
      resolves by cosine similarities).  ``centre_init="shared"`` (default): one draw
      of the objective's initialiser for all ``S`` centres and uniformly random
      initial labels (identical centres would tie on every point); the centres then
      stay in one basin, so eq. 2's weighted sum of networks is a usable model.
      ``"independent"``: ``S`` draws, points labelled by lowest loss over them.
    * **Local training** (step 1): ``s_i`` drawn from ``weights[i]`` (seeded); the
      batches hold ``B`` of client i's points labelled ``s_i`` (``B`` = the run's
      batch size, all ``n`` points without one): a fresh random order of those points
      per step, wrapped around when fewer than ``B`` carry the label.  ``tau`` steps
      of (heavy-ball) SGD at ``lr * lr_decay ** (t // lr_decay_every)``; round 0 runs
      ``2 tau`` steps with ``double_first_round``.
    * **Exchange and centre update** (steps 2-3): every client broadcasts its
      trained centre through
      :func:`~defenses.graph_rounds.received_from_neighbours` (kind ``"model"``: one
      model per client per round, as in the paper; a Byzantine node may send each
      neighbour a different row).  The cluster index ``s_j`` travels with it and is
      taken as declared: Byzantine nodes declare the cluster their own (honest)
      draw gave, the attack controls the model.  Only clients that trained ``s``
      change ``c_s`` (Sec. 4 step 3: "updates the cluster center of the cluster s it
      selected"; Alg. 1 line 24: the row and column of a client that did not select
      ``s`` are the identity's).  With the graph's mixing weights ``w``:

      - ``graph.weights = "uniform"`` (eq. 1, the paper's experiments): ``c_is`` becomes
        the mean of the centres of the clients in ``i``'s closed neighbourhood that
        trained ``s``; row-stochastic only.
      - ``graph.weights = "metropolis"`` (what the proof's Lemma A.1 needs):
        ``c_is <- c_is + sum_j w_ij (c_js - c_is)`` over the neighbours ``j`` that
        trained ``s``, i.e. the Metropolis weights of the graph with every missing
        neighbour's weight moved to the diagonal: symmetric, hence doubly
        stochastic, so the network mean of every ``C_s`` is preserved.

      Robustness: a received row that is not finite or whose squared norm overflows
      (:func:`~defenses.threshold_clustering.admissible_points`) is dropped; under
      "uniform" the mean is taken over the admissible senders, under "metropolis" its
      weight goes to the receiver's own centre.  No NaN or Inf reaches an honest
      centre.  Finite hostile rows are averaged in: FedSPD has no robust aggregation.
    * **Data clustering** (step 4): every point of client i is labelled with the
      centre of lowest loss (ties: the lower index), from the objective's per-sample
      losses.
    * **Personalised model** (eq. 2 and ``FINALPHASE``): ``sum_s u_is c_is`` plus
      ``finetune_steps`` local gradient steps on all of client i's data (or seeded
      batches of ``finetune_batch``), computed when :meth:`client_models` is called
      and cached until the next round.  Training never uses it.

    ``graph.dynamic`` redraws the graph every round (``federation_graph(fed, spec,
    t)``).  Records: ``gradients`` the first local step's honest gradients,
    ``updates`` ``(c_{i s_i}^t - c_{i s_i}^{t+1}) / lr_t`` (the whole move of the
    trained centre), ``centres`` the network mean of every cluster's centre ``[S, d]``,
    ``assignment`` each client's dominant cluster, ``extras`` the selections
    (``"selected"``) and mixture weights (``"mixture_weights"``).
    """

    name = "fedspd"
    published_state = defense_state.FEDSPD
    summary = "FedSPD: decentralised soft clustering on a graph, S centres per client, per-sample relabelling"
    reference = "Lin, Yagin, Joe-Wong 2025 (UAI), FedSPD: soft-clustering personalized decentralized FL, Alg. 1"
    Params = FedSPDParams
    forms_clusters = True

    # the last exchange's C_s, reused for the next one's result; scratch, left out of
    # checkpoints (a class default, so older ones load too)
    _spare: Tensor | None = None

    def __init__(self, federation: Federation, params: FedSPDParams) -> None:
        super().__init__(federation, params)
        fed, s = federation, params.centres
        if params.centre_init == "independent":
            initial = fed.init_params(s, stream="fedspd-init")
        else:
            initial = fed.init_params(1, stream="fedspd-init").expand(s, -1)
        self.centres = initial.unsqueeze(1).expand(s, fed.clients, -1).clone()  # [S, N, d]
        self._select_rng = fed.rng("fedspd-select")
        self._batch_rng = fed.rng("fedspd-batches")
        self.graph: Graph | None = None if params.graph.dynamic else federation_graph(fed, params.graph)
        if params.centre_init == "independent":
            self.labels = self._lowest_loss_labels()
        else:
            labels_rng = fed.rng("fedspd-labels")
            shape = (fed.clients, fed.train.samples_per_client)
            self.labels = torch.randint(s, shape, generator=labels_rng, device=labels_rng.device).to(fed.device)
        self.rounds_done = 0
        self._personalised: tuple[int, Tensor] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # the personalised models are recomputed from the state on demand; the spare is scratch
        return {**self.__dict__, "_personalised": None, "_spare": None}

    @property
    def budget_mb(self) -> float:
        """``budget_mb``, or the device's default."""
        return self.params.budget_mb or memory_budget_mb(self.federation.device, FEDSPD_CPU_BUDGET_MB)

    # -- facts ---------------------------------------------------------------------------
    @property
    def mixture_weights(self) -> Tensor:
        """``u[N, S]``: each client's fraction of points labelled with each cluster."""
        onehot = torch.nn.functional.one_hot(self.labels, self.params.centres)
        return onehot.to(self.federation.dtype).mean(dim=1)

    def learning_rate(self, round_index: int) -> float:
        p = self.params
        return p.lr * p.lr_decay ** (round_index // p.lr_decay_every)

    def graph_of(self, round_index: int) -> Graph:
        """The communication graph of round ``round_index``."""
        if self.graph is not None:
            return self.graph
        return federation_graph(self.federation, self.params.graph, round_index)

    # -- one round -----------------------------------------------------------------------
    def step(self, round_index: int) -> RoundRecord:
        fed, p = self.federation, self.params
        lr = self.learning_rate(round_index)
        weights = self.mixture_weights
        selected = torch.multinomial(weights, 1, generator=self._select_rng).squeeze(-1).to(fed.device)
        clients = torch.arange(fed.clients, device=fed.device)
        # step 1: tau SGD steps on the chosen centre, batches of the points labelled with it
        start = self.centres[selected, clients]  # [N, d] copy
        trained = start.clone()
        optimizer = HeavyBall(lr, p.heavy_ball, trained)
        steps = p.local_steps * (2 if p.double_first_round and round_index == 0 else 1)
        first = None
        for _ in range(steps):
            grads = fed.gradients(trained, self._cluster_batch(selected))
            first = grads if first is None else first
            optimizer.apply(trained, grads)
        # steps 2-3: exchange with the neighbours, mix per cluster
        graph = self.graph_of(round_index)
        self.centres = self._exchange(trained, selected, graph, round_index)
        # step 4: relabel every point by its lowest-loss centre
        self.labels = self._lowest_loss_labels()
        self.rounds_done = round_index + 1
        self._personalised = None
        moved = (start - self.centres[selected, clients]) / lr
        weights = self.mixture_weights
        return RoundRecord(
            round_index,
            gradients=first,
            updates=moved,
            centres=self.centres.mean(dim=1),
            assignment=weights.argmax(dim=-1),
            extras={"selected": selected, "mixture_weights": weights},
        )

    def _cluster_batch(self, selected: Tensor) -> Batch:
        """``B`` points per client from those labelled ``selected[i]``: a fresh random
        order of them, wrapped around when fewer than ``B`` (one gather, no loop)."""
        fed = self.federation
        n = fed.train.samples_per_client
        size = fed.batch_size or n
        own = self.labels == selected.unsqueeze(-1)  # [N, n]
        keys = torch.rand(fed.clients, n, generator=self._batch_rng, device=self._batch_rng.device).to(fed.device)
        order = keys.masked_fill(~own, 2.0).argsort(dim=1)  # the labelled points first
        count = own.sum(dim=1, keepdim=True).clamp_min(1)
        positions = torch.arange(size, device=fed.device).unsqueeze(0) % count
        index = order.gather(1, positions)
        rows = torch.arange(fed.clients, device=fed.device).unsqueeze(-1)
        return Batch(fed.train.inputs[rows, index], fed.train.targets[rows, index])

    def _exchange(self, trained: Tensor, selected: Tensor, graph: Graph, round_index: int) -> Tensor:
        """Steps 2-3: the new ``centres[S, N, d]`` after every client broadcast its
        trained centre and mixed what it received.  The receivers are chunked to the
        memory budget for their Byzantine rows (the only rows that differ between
        receivers); the honest part is one product per cluster for all receivers."""
        fed, p = self.federation, self.params
        s_count = p.centres
        before = self.centres.clone()
        clients = torch.arange(fed.clients, device=fed.device)
        before[selected, clients] = trained  # C_s with the trained rows, what W_s multiplies
        mixing = graph.mixing_weights(p.graph.weights, dtype=fed.dtype).to(fed.device)
        byzantine = fed.byzantine
        honest_ok = admissible_points(trained)  # finite (HeavyBall skips non-finite steps); checked all the same
        state = self._defense_state(graph, selected, mixing)
        honest_weights = mixing.new_empty(s_count, fed.clients, fed.clients)  # W_s without the attack's columns
        spare, self._spare = self._spare, None
        fits = (
            spare is not None
            and (spare.shape, spare.dtype) == (before.shape, before.dtype)
            and same_device(spare.device, before.device)
        )
        # the attack's part first, then the whole mix, in reused memory (a fresh [S, N, d]
        # tensor page-faults on its first writes)
        after = spare if fits else torch.empty_like(before)
        attacked = fed.attack is not None and bool(byzantine.any())
        b_count = int(byzantine.sum())
        # without an attack every receiver gets the broadcast itself (a view): one chunk
        chunks = (
            receiver_chunks(fed.clients, trained.shape[-1], self.budget_mb, trained.element_size(), rows=b_count)
            if attacked
            else [clients]
        )
        for receivers in chunks:
            receivers = receivers.to(fed.device)
            span = slice(int(receivers[0]), int(receivers[-1]) + 1)
            assert span.stop - span.start == receivers.numel(), "receiver chunks are consecutive clients"
            own = receivers.unsqueeze(-1) == clients.unsqueeze(0)  # [R, N]
            from_attack = byzantine.unsqueeze(0) & ~own  # rows the attack writes
            needed = (graph.adjacency[receivers] & from_attack)[:, byzantine]  # [R, B]: Byzantine neighbours
            attack_rows = received_from_neighbours(  # [P, d]: the needed rows; the honest ones are ``before``'s
                fed, trained, round_index, "model", receivers, self._receiver_state(state, graph, receivers, span),
                byzantine_only=True, needed=needed,
            )
            attack_ok = admissible_points(attack_rows)  # [P]
            admissible = honest_ok.unsqueeze(0).expand_as(own).clone()
            admissible[:, byzantine] = admissible[:, byzantine].masked_scatter(needed, attack_ok)
            coefficients = cluster_weights(
                mixing[receivers], selected, receivers, s_count, p.graph.weights, admissible | own
            )
            honest_weights[:, span] = coefficients * (~from_attack).to(coefficients.dtype)
            if b_count:
                after[:, span] = _attack_part(coefficients[..., byzantine], needed, attack_rows, attack_ok)
        for s in range(s_count):
            if b_count:
                after[s].addmm_(honest_weights[s], before[s])  # honest part + attack part
            else:
                torch.mm(honest_weights[s], before[s], out=after[s])
        self._spare = before  # nothing else holds it
        return after

    def _defense_state(self, graph: Graph, selected: Tensor, mixing: Tensor) -> dict[str, Any]:
        """What adaptive attacks see: the centres, selections, mixture weights, the
        graph, and an ``aggregate`` probe: for candidate messages ``[..., N, d]``
        received by everyone, the centre each client would hold for the cluster it
        trained, ``[..., N, d]``."""
        fed, p = self.federation, self.params
        clients = torch.arange(fed.clients, device=fed.device)

        def aggregate(messages: Tensor) -> Tensor:
            admissible = admissible_points(messages).unsqueeze(-2).expand(*messages.shape[:-2], fed.clients, -1)
            coefficients = cluster_weights(mixing, selected, clients, p.centres, p.graph.weights, admissible)
            chosen = coefficients[..., selected, clients, :]  # [..., N(receivers), N(senders)]
            clean = torch.where(admissible_points(messages).unsqueeze(-1), messages, torch.zeros_like(messages))
            return chosen @ clean

        return {
            "centres": self.centres,
            "selected": selected,
            "mixture_weights": self.mixture_weights,
            "adjacency": graph.adjacency,
            "aggregate": aggregate,
        }

    def _receiver_state(self, state: dict[str, Any], graph: Graph, receivers: Tensor, span: slice) -> dict[str, Any]:
        """``state`` as the receivers ``receivers[R]`` (the clients ``span``) see it, for attacks that work per
        receiver (the leading dimension of the delivered messages): ``centres[R, S, d]``,
        the S centres each receiver holds; ``neighbours[R, N]``, each receiver's closed
        neighbourhood; ``aggregate`` mapping messages ``[..., R, N, d]`` to the centre
        each receiver would hold for the cluster it trained, ``[..., R, 1, d]``.  The
        whole ``[S, N, d]`` tensor stays under ``all_centres``."""
        everyone = state["aggregate"]
        index = receivers.view(-1, 1)

        def aggregate(messages: Tensor) -> Tensor:
            held = everyone(messages)  # [..., R, N(receivers), d]
            picked = index.expand(*held.shape[:-3], -1, 1).unsqueeze(-1).expand(*held.shape[:-3], -1, 1, held.shape[-1])
            return torch.gather(held, -2, picked)

        closed = graph.adjacency[receivers] | (torch.arange(graph.n, device=receivers.device) == index)
        return {
            **state,
            "all_centres": self.centres,
            "centres": self.centres[:, span].transpose(0, 1),  # a view
            "neighbours": closed,
            "aggregate": aggregate,
        }

    def _lowest_loss_labels(self) -> Tensor:
        """Step 4: every training point's lowest-loss centre ``[N, n]`` (ties: the
        lower index)."""
        fed = self.federation
        losses = torch.stack(
            [per_sample_losses(fed.objective, self.centres[s], fed.train) for s in range(self.params.centres)]
        )
        losses = torch.where(torch.isnan(losses), torch.full_like(losses, torch.inf), losses)
        return losses.argmin(dim=0)

    # -- the personalised models ------------------------------------------------------------
    def client_models(self) -> Tensor:
        if self._personalised is None or self._personalised[0] != self.rounds_done:
            self._personalised = (self.rounds_done, self._final_phase())
        return self._personalised[1]

    def _final_phase(self) -> Tensor:
        """Eq. 2, ``sum_s u_is c_is``, then ``finetune_steps`` local gradient steps on
        the client's data (Alg. 1 ``FINALPHASE``); batches, if any, from a stream of
        the round, so the result depends on the state only."""
        fed, p = self.federation, self.params
        weights = self.mixture_weights  # [N, S]
        models = torch.einsum("ns,snd->nd", weights, self.centres)
        if p.finetune_steps == 0:
            return models
        lr = p.finetune_lr or self.learning_rate(self.rounds_done)
        optimizer = HeavyBall(lr, p.heavy_ball, models)
        stream = fed.rng(f"fedspd-finetune/{self.rounds_done}")
        for _ in range(p.finetune_steps):
            batch = fed.train if p.finetune_batch is None else fed.train.sample(p.finetune_batch, stream)
            optimizer.apply(models, fed.gradients(models, batch))
        return models


def _attack_part(coefficients: Tensor, needed: Tensor, rows: Tensor, admissible: Tensor) -> Tensor:
    """``[S, R, d]``: each receiver's weighted sum of the Byzantine rows it reads.

    ``coefficients[S, R, B]`` are the Byzantine columns of ``W_s``, ``needed[R, B]``
    the pairs read and ``rows[P, d]`` their messages (``needed.nonzero()`` order); an
    inadmissible row weighs nothing (its coefficient is 0 and it is read as zeros).
    Each receiver's rows are laid out in ``w`` slots (its most Byzantine neighbours,
    zero-padded): one batched product over receivers, in at most the ``[R, B, d]``
    memory the caller budgets for."""
    s_count, r_count = coefficients.shape[:2]
    counts = needed.sum(-1)  # [R]
    width = int(counts.max()) if r_count else 0
    if width == 0:
        return rows.new_zeros(s_count, r_count, rows.shape[-1])
    clean = rows if bool(admissible.all()) else torch.where(admissible.unsqueeze(-1), rows, 0.0)
    slots = torch.arange(width, device=rows.device) < counts.unsqueeze(-1)  # [R, w]: a receiver's first slots
    padded = rows.new_zeros(r_count, width, rows.shape[-1])
    padded[slots] = clean  # row-major: the pairs in needed.nonzero() order
    weights = coefficients.new_zeros(s_count, r_count, width)
    weights[:, slots] = coefficients[:, needed]
    return torch.einsum("srw,rwd->srd", weights, padded)


def cluster_weights(
    mixing: Tensor,
    selected: Tensor,
    receivers: Tensor,
    clusters: int,
    rule: MixingRule,
    admissible: Tensor | None = None,
) -> Tensor:
    """The rows of FedSPD's ``W_s`` for ``receivers[R]``: ``[..., S, R, N]``.

    ``mixing[R, N]`` are the receivers' rows of the graph's mixing matrix (zero off the
    closed neighbourhood), ``selected[N]`` the cluster every client trained,
    ``admissible[..., R, N]`` which received rows may be used (default: all).  Row
    ``(s, r)`` gives the weights of the senders' centres in receiver ``r``'s new
    ``c_s``; the receiver's own column weighs its own centre.  A receiver that did not
    train ``s`` keeps its centre (its row is the unit vector).  ``"uniform"``: the
    mean over the admissible closed neighbours that trained ``s`` (eq. 1).
    ``"metropolis"``: ``w_ij`` for those neighbours and the rest on the diagonal
    (symmetric when every row is admissible, hence doubly stochastic)."""
    n = mixing.shape[-1]
    own = torch.nn.functional.one_hot(receivers, n).to(torch.bool)  # [R, N]
    cluster = torch.arange(clusters, device=mixing.device)
    senders = (selected.unsqueeze(0) == cluster.unsqueeze(-1)).unsqueeze(-2)  # [S, 1, N]
    training = (selected[receivers].unsqueeze(0) == cluster.unsqueeze(-1)).unsqueeze(-1)  # [S, R, 1]
    usable = senders & training
    if admissible is not None:
        usable = usable & (admissible | own).unsqueeze(-3)
    eye = own.to(mixing.dtype)
    if rule == "uniform":
        weights = mixing * usable.to(mixing.dtype)
        total = weights.sum(dim=-1, keepdim=True)
        return torch.where(total > 0, weights / total.clamp_min(torch.finfo(mixing.dtype).tiny), eye)
    if rule == "metropolis":
        weights = mixing * (usable & ~own).to(mixing.dtype)
        return weights + eye * (1 - weights.sum(dim=-1, keepdim=True))
    raise ValueError(f"graph.weights must be 'uniform' or 'metropolis', got {rule!r}")


def per_sample_losses(objective: Objective, params: Tensor, data: ClientData) -> Tensor:
    """Loss of model ``params[i]`` on each of client i's points: ``[N, n]``.

    Networks with ``outputs`` and a ``loss_kind`` (every :class:`DenseNetwork` and
    image network) use the batched outputs; any other objective its ``loss`` on
    one-point batches (``vmap`` over clients and points)."""
    kind = getattr(objective, "loss_kind", None)
    if kind is not None:
        outputs = objective.paired_outputs(params, data)
        return loss_from_outputs(outputs, data.targets, kind)

    def one_point(row: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return objective.loss(row, x.unsqueeze(0), y.unsqueeze(0))

    per_point = vmap(one_point, in_dims=(None, 0, 0))
    return vmap(per_point)(params, data.inputs, data.targets)
