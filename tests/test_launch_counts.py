"""Launch counts measured on the CPU (issue 45): the counter itself on hand-computed
cases, and bounds on the operators and host synchronisations one step of FC with 16
groups, MC and IFCA dispatches on the accelerator's code paths, so that a change that
adds launches (a loop over clients, a sync per round of clustering) fails here, in CI,
without a GPU."""

from __future__ import annotations

import pytest
import torch

import attacks
import defenses
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.devices import using_engine
from robust_pfl.engine.federation import Federation, MaskFacts
from robust_pfl.engine.launches import LaunchCount, count_launches
from robust_pfl.engine.objectives import DenseNetwork

# -- the counter ---------------------------------------------------------------------------


def test_views_are_not_kernels_and_in_place_writes_are():
    x = torch.randn(6, 4)
    _, count = count_launches(lambda: (x.t(), x[1:3], x.view(24), x.add_(1.0)))
    assert (count.views, count.kernels, count.syncs) == (3, 1, 0)
    assert count.by_operator["add_"] == 1


def test_host_reads_are_syncs():
    x = torch.randn(6, 4)

    def work():
        x.sum().item()  # _local_scalar_dense
        bool(x.any())  # is_nonzero / _local_scalar_dense
        x[x > 0]  # boolean-mask indexing
        x.nonzero()
        torch.equal(x, x)
        x[torch.tensor([0, 2])]  # integer indexing: no sync

    _, count = count_launches(work)
    assert count.syncs == 5


def test_matmul_flops_and_moved_bytes_are_exact_on_hand_cases():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    batched = torch.randn(2, 3, 5), torch.randn(2, 5, 7)
    _, count = count_launches(lambda: (a @ b, torch.bmm(*batched)))
    assert count.flops == 2 * 3 * 5 * 7 + 2 * 2 * 3 * 5 * 7
    source = torch.randn(100, 8)
    index = torch.tensor([3, 5])
    _, gather = count_launches(lambda: torch.index_select(source, 0, index))
    assert gather.bytes == 2 * (2 * 8 * 4) + 2 * 8  # the rows read and written, and the indices
    _, fresh = count_launches(lambda: source.new_empty(100, 8))
    assert fresh.bytes == 0


def test_mask_facts_are_read_on_the_host():
    facts = MaskFacts.of(torch.tensor([False, True, True, False]))
    assert (facts.some, facts.every, facts.span) == (True, False, (1, 3))
    assert MaskFacts.of(torch.tensor([True, False, True])).span is None
    assert MaskFacts.of(torch.zeros(3, dtype=torch.bool)) == MaskFacts(False, False, None)
    assert MaskFacts.of(torch.ones(2, dtype=torch.bool)) == MaskFacts(True, True, (0, 2))


def test_changed_byzantine_mask_is_read_afresh():
    fed = _federation(10)
    assert fed.byzantine_facts.span == (8, 10)
    fed.byzantine[0] = True  # in place: the cached facts are stale
    assert fed.byzantine_facts.span is None and fed.byzantine_facts.some
    fed.byzantine = torch.zeros(10, dtype=torch.bool)
    assert not fed.byzantine_facts.some


# -- bounds on one step ------------------------------------------------------------------------

CLUSTERING = {"radius": {"policy": "quantile", "q": 0.2}, "clustering_rounds": 10}
METHODS = {
    "ifca": ("ifca", {"lr": 0.1}),
    "mc": ("mc", {"lr": 0.1, **CLUSTERING}),
    "fc g=16": ("fc", {"lr": 0.1, **CLUSTERING, "groups": 16}),
}
# Kernels and host syncs of one steady-state step on the batched engine, at N = 64 and
# N = 256 (tiny MLP, a fifth of the clients sending large gradients): the counts at
# the commit that set them, with about 25% headroom.  The clustering's rounds, seeds,
# tie reads and checks cost a fixed number of operators per clustering call; FC with
# 16 groups makes one call per group size (its groups differ by one client at most).
BOUNDS = {"ifca": (105, 8), "mc": (1420, 30), "fc g=16": (1900, 110)}
# How much more a step may dispatch at N = 256 than at N = 64: a tenth more, plus, for
# FC, two kernels per extra honest receiver (its first-layer weight-gradient product,
# whose input all receivers share, and the attack's draw of its Byzantine rows, drawn
# per receiver so that the values do not depend on the chunking).  Nothing else may
# grow with the number of clients (a per-client loop adds about N operators).
GROWTH = 1.1
PER_RECEIVER = {"ifca": 0, "mc": 0, "fc g=16": 2}


def _federation(clients: int) -> Federation:
    byzantine_count = clients // 5
    honest = clients - byzantine_count
    generator = torch.Generator().manual_seed(0)
    cluster_ids = torch.cat([torch.arange(honest) % 4, torch.arange(byzantine_count) % 4])
    byzantine = torch.zeros(clients, dtype=torch.bool)
    byzantine[honest:] = True
    federation = Federation(
        objective=DenseNetwork(16, 4, (8,)),
        train=ClientData(torch.rand(clients, 16, 16, generator=generator),
                         torch.randint(0, 4, (clients, 16), generator=generator)),
        cluster_ids=cluster_ids, byzantine=byzantine, seed=0, batch_size=8,
        attack=attacks.build("large_gradient", {"mean": 1e6, "std": 200.0}),
    )
    federation.num_classes = 4
    return federation


def step_count(label: str, clients: int) -> LaunchCount:
    """The launches of round 2 (after the seeding round and one more) on the batched
    engine, as a GPU would run it."""
    name, options = METHODS[label]
    algorithm = defenses.build(name, _federation(clients), options)
    algorithm.snapshot_records = False
    with using_engine("batched"):
        algorithm.step(0)
        algorithm.step(1)
        _, count = count_launches(lambda: algorithm.step(2))
    return count


def within_bounds(label: str, small: LaunchCount, large: LaunchCount) -> list[str]:
    """What breaks :data:`BOUNDS` and :data:`GROWTH` (empty when nothing does)."""
    kernels, syncs = BOUNDS[label]
    problems = []
    for clients, count in ((64, small), (256, large)):
        if count.kernels > kernels:
            problems.append(f"{label} N={clients}: {count.kernels} kernels > {kernels}; top {count.top(6)}")
        if count.syncs > syncs:
            problems.append(f"{label} N={clients}: {count.syncs} syncs > {syncs}")
    extra_receivers = (256 - 256 // 5) - (64 - 64 // 5)
    if large.kernels > GROWTH * small.kernels + PER_RECEIVER[label] * extra_receivers:
        problems.append(f"{label}: {large.kernels} kernels at N=256 against {small.kernels} at N=64")
    return problems


@pytest.mark.parametrize("label", sorted(METHODS))
def test_step_launches_are_bounded_and_do_not_grow_with_clients(label):
    assert within_bounds(label, step_count(label, 64), step_count(label, 256)) == []


def test_a_loop_over_clients_breaks_the_bounds():
    """The negative control: IFCA's step followed by one small operation per client
    (what a Python loop over clients adds) fails both the bound and the growth check."""

    def looped(clients: int) -> LaunchCount:
        count = step_count("ifca", clients)
        values = torch.randn(clients)
        _, loop = count_launches(lambda: [values[i] * 2 for i in range(clients)])
        count.kernels += loop.kernels
        return count

    problems = within_bounds("ifca", looped(64), looped(256))
    assert any("kernels >" in problem for problem in problems)
    assert any("at N=256 against" in problem for problem in problems)


def test_the_step_under_the_counter_gives_the_same_models():
    """Counting changes nothing: the counted step's models equal an uncounted one's."""
    name, options = METHODS["mc"]
    results = []
    for counted in (False, True):
        algorithm = defenses.build(name, _federation(64), options)
        algorithm.snapshot_records = False
        with using_engine("batched"):
            algorithm.step(0)
            algorithm.step(1)
            if counted:
                count_launches(lambda: algorithm.step(2))
            else:
                algorithm.step(2)
        results.append(algorithm.client_models().clone())
    assert torch.equal(*results)


def test_an_evaluation_reads_its_means_back_in_few_syncs():
    """``honest_means`` on the batched engine finds the honest rows once and reads every
    mean back in one transfer: at most 8 host syncs (the honest rows, the means, the
    worst cluster's mean and its sizes), whatever the number of metrics; the same values
    as one read per metric, which costs more than the bound (the negative control)."""
    from robust_pfl.experiments import RunParts, honest_means, method_params, parse_and_validate
    from robust_pfl.recipes import fig6

    grid = fig6.grids(fig6.DIGITS, None, True, ("bit_flip",))[-1]
    config = parse_and_validate(dict(grid.cells[0].config))
    parts = RunParts.build(config, 0, None)
    method = config.methods[0]
    algorithm = defenses.build(method.name, parts.federation, params=method_params(config, method))
    with using_engine("batched"):
        means, count = count_launches(lambda: honest_means(parts.evaluation, algorithm))

        def one_read_per_metric() -> dict[str, float]:
            models = algorithm.client_models()
            honest = ~parts.evaluation.byzantine
            per_client = parts.evaluation.evaluate(models, algorithm.predict_log_proba)
            return {name: float(values[honest].double().mean()) for name, values in per_client.items()}

        reference, slow = count_launches(one_read_per_metric)
    assert count.syncs <= 8
    assert slow.syncs > 8
    assert {name: means[name] for name in reference} == reference
