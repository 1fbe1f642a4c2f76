"""The core federation: the attack injection point, seeded streams, client placement,
the synthetic task, and the shared helpers ``group_mean`` and ``HeavyBall``."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attacks
from defenses.optimiser import HeavyBall
from defenses.primitives import group_mean
from robust_pfl import Federation
from robust_pfl.engine.data import ClientData
from robust_pfl.engine.objectives import linear_regression
from robust_pfl.engine.tasks import SyntheticLinearRegression, place_clients
from robust_pfl.engine.types import AttackBase, AttackContext


def small_task(seed: int = 0, byzantine_total: int = 2, dtype=torch.float64, **overrides):
    spec = dict(clusters=2, clients_per_cluster=3, dim=5, samples_per_client=6,
                validation_samples=4, test_samples=4, scale=10.0)
    spec.update(overrides)
    return SyntheticLinearRegression(**spec).build(seed, byzantine_total=byzantine_total, dtype=dtype)


class FunctionAttack(AttackBase):
    """A plain function as an attack (the tests' one-line attacks), with AttackBase's
    declared defaults."""

    def __init__(self, function) -> None:
        self.function = function

    def __call__(self, messages, context):
        return self.function(messages, context)


def federation(task, attack=None, seed: int = 0, batch_size: int | None = 3) -> Federation:
    if attack is not None and not isinstance(attack, AttackBase):
        attack = FunctionAttack(attack)
    return Federation(task.objective, task.train, task.cluster_ids, task.byzantine, seed, batch_size, attack)


class MarkerAttack(AttackBase):
    """Byzantine row r (in mask order) becomes ``1000 + r`` in every coordinate, so the
    order of the replacement is visible.  Records the contexts it saw."""

    def __init__(self) -> None:
        self.contexts: list[AttackContext] = []

    def __call__(self, messages, context):
        self.contexts.append(context)
        count = int(context.byzantine.sum())
        rows = 1000.0 + torch.arange(count, dtype=messages.dtype)
        shape = (*messages.shape[:-2], count, messages.shape[-1])
        return rows.view(count, 1).expand(shape).clone()


# -- deliver: the injection point -----------------------------------------------------------
def test_deliver_replaces_exactly_the_byzantine_rows():
    task = small_task()
    attack = MarkerAttack()
    fed = federation(task, attack)
    n, d = fed.clients, task.objective.dim
    messages = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    original = messages.clone()

    delivered = fed.deliver(messages, 7, "gradient", defense_state={"radius": 2.0})

    assert torch.equal(messages, original), "deliver mutated its input"
    honest = ~fed.byzantine
    assert torch.equal(delivered[honest], original[honest])
    byz_index = fed.byzantine.nonzero().squeeze(-1)
    assert byz_index.numel() == 2
    for r, i in enumerate(byz_index.tolist()):
        assert torch.equal(delivered[i], torch.full((d,), 1000.0 + r, dtype=torch.float64))
    (context,) = attack.contexts
    assert context.round_index == 7
    assert context.kind == "gradient"
    assert torch.equal(context.byzantine, fed.byzantine)
    assert torch.equal(context.cluster_ids, fed.cluster_ids)
    assert context.defense_state["radius"] == 2.0
    assert context.receivers is None


def test_deliver_handles_leading_model_dimension():
    task = small_task()
    attack = MarkerAttack()
    fed = federation(task, attack)
    m, n, d = 3, fed.clients, task.objective.dim
    messages = torch.randn(m, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    original = messages.clone()
    receivers = torch.tensor([0, 1, 4])

    delivered = fed.deliver(messages, 0, "cross_gradient", receivers=receivers)

    assert delivered.shape == (m, n, d)
    assert torch.equal(messages, original)
    honest = ~fed.byzantine
    assert torch.equal(delivered[:, honest], original[:, honest])
    byz_index = fed.byzantine.nonzero().squeeze(-1)
    for r, i in enumerate(byz_index.tolist()):
        assert torch.equal(delivered[:, i], torch.full((m, d), 1000.0 + r, dtype=torch.float64))
    assert torch.equal(attack.contexts[0].receivers, receivers)


def test_deliver_with_sender_subset():
    task = small_task()
    attack = MarkerAttack()
    fed = federation(task, attack)
    byz_index = fed.byzantine.nonzero().squeeze(-1).tolist()
    # senders: two honest clients and the last Byzantine one, in a scrambled order
    senders = torch.tensor([byz_index[-1], 0, 4])
    d = task.objective.dim
    messages = torch.randn(2, 3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    original = messages.clone()

    delivered = fed.deliver(messages, 1, "cross_gradient", senders=senders)

    assert torch.equal(delivered[:, 1:], original[:, 1:]), "honest senders' rows changed"
    assert torch.equal(delivered[:, 0], torch.full((2, d), 1000.0, dtype=torch.float64))
    context = attack.contexts[0]
    assert context.byzantine.tolist() == [True, False, False]
    assert torch.equal(context.cluster_ids, fed.cluster_ids[senders])


def test_deliver_passes_messages_unchanged_without_byzantine_senders_or_attack():
    task = small_task()
    attack = MarkerAttack()
    fed = federation(task, attack)
    d = task.objective.dim
    honest_only = fed.honest.nonzero().squeeze(-1)[:3]
    messages = torch.randn(3, d, dtype=torch.float64)
    assert torch.equal(fed.deliver(messages, 0, "gradient", senders=honest_only), messages)
    assert attack.contexts == []

    no_attack = federation(task, None)
    full = torch.randn(no_attack.clients, d, dtype=torch.float64)
    assert torch.equal(no_attack.deliver(full, 0, "gradient"), full)


@pytest.mark.parametrize("bad_rows", [1, 3])
def test_attack_returning_wrong_shape_raises(bad_rows):
    task = small_task()

    def wrong(messages, context):
        return messages.new_zeros(bad_rows, messages.shape[-1])

    fed = federation(task, wrong)
    with pytest.raises(ValueError, match="shape"):
        fed.deliver(torch.zeros(fed.clients, task.objective.dim, dtype=torch.float64), 0, "gradient")


def test_attack_returning_wrong_dimension_raises():
    task = small_task()
    fed = federation(task, lambda messages, context: messages.new_zeros(2, messages.shape[-1] + 1))
    with pytest.raises(ValueError, match="shape"):
        fed.deliver(torch.zeros(fed.clients, task.objective.dim, dtype=torch.float64), 0, "gradient")


def test_federation_rejects_mismatched_masks():
    task = small_task()
    with pytest.raises(ValueError):
        Federation(task.objective, task.train, task.cluster_ids[:-1], task.byzantine)
    with pytest.raises(ValueError):
        Federation(task.objective, task.train, task.cluster_ids, task.byzantine[:-1])


# -- seeded streams -------------------------------------------------------------------------
def test_attack_stream_is_independent_of_batch_stream():
    """Adding an attack (which draws random numbers) never changes the batches drawn."""
    task = small_task()
    attacked = federation(task, attacks.LargeGradient(), seed=5)
    clean = federation(task, None, seed=5)
    d = task.objective.dim
    draws = []
    for t in range(4):
        a, b = attacked.sample_batch(), clean.sample_batch()
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets), t
        draws.append(a.inputs)
        out = attacked.deliver(torch.zeros(attacked.clients, d, dtype=torch.float64), t, "gradient")
        assert not torch.equal(out, torch.zeros_like(out))  # the attack really ran
    # not vacuous: the batch stream does vary from round to round
    assert any(not torch.equal(draws[0], later) for later in draws[1:])


def test_attack_noise_is_seeded():
    task = small_task()
    d = task.objective.dim
    outs = []
    for seed in (4, 4, 5):
        fed = federation(task, attacks.LargeGradient(), seed=seed)
        outs.append(fed.deliver(torch.zeros(fed.clients, d, dtype=torch.float64), 0, "gradient"))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def test_reused_batches_hold_the_same_samples():
    """``sample_batch(reuse=True)`` gathers into one buffer: the same samples as a fresh
    gather from the same stream, round after round."""
    task = small_task()
    fresh, reused = federation(task, seed=4), federation(task, seed=4)
    buffers = set()
    for _ in range(4):
        a, b = fresh.sample_batch(), reused.sample_batch(reuse=True)
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
        buffers.add(b.inputs.data_ptr())
    assert len(buffers) == 1


def test_sample_batch_draws_distinct_own_samples():
    task = small_task()
    fed = federation(task, batch_size=4)
    batch = fed.sample_batch()
    n = fed.clients
    assert batch.inputs.shape == (n, 4, task.objective.dim)
    for i in range(n):
        own = task.train.inputs[i]
        picked = batch.inputs[i]
        # every drawn row is one of client i's rows, and no row is drawn twice
        match = (picked.unsqueeze(1) == own.unsqueeze(0)).all(-1)  # [4, n_i]
        assert bool(match.any(1).all())
        idx = match.float().argmax(1)
        assert idx.unique().numel() == 4
        assert torch.equal(batch.targets[i], task.train.targets[i][idx])


# -- placement ------------------------------------------------------------------------------
def _byzantine_per_cluster(ids, byz, clusters):
    return torch.bincount(ids[byz], minlength=clusters).tolist()


def test_place_clients_per_cluster_versus_total():
    # "50 Byzantine per cluster" (paper text) vs "50 in total" (official code), K = 4
    ids, byz = place_clients(4, 50, byzantine_per_cluster=50)
    assert ids.numel() == 400 and int(byz.sum()) == 200
    assert _byzantine_per_cluster(ids, byz, 4) == [50, 50, 50, 50]

    ids, byz = place_clients(4, 50, byzantine_total=50)
    assert ids.numel() == 250 and int(byz.sum()) == 50
    # 50 = 4 * 12 + 2: spread as evenly as possible
    assert sorted(_byzantine_per_cluster(ids, byz, 4)) == [12, 12, 13, 13]

    for ids, byz in (place_clients(4, 50, byzantine_total=50), place_clients(4, 50, byzantine_per_cluster=50)):
        assert torch.bincount(ids[~byz], minlength=4).tolist() == [50, 50, 50, 50]


def test_place_clients_both_kinds_add_up():
    ids, byz = place_clients(3, 2, byzantine_total=4, byzantine_per_cluster=1)
    assert ids.numel() == 3 * 2 + 3 * 1 + 4
    assert int(byz.sum()) == 7
    # 1 per cluster, plus 4 = 3 + 1 spread evenly: one cluster gets 3, the others 2
    assert sorted(_byzantine_per_cluster(ids, byz, 3)) == [2, 2, 3]
    assert torch.bincount(ids[~byz], minlength=3).tolist() == [2, 2, 2]
    assert int(ids.max()) == 2 and int(ids.min()) == 0


def test_place_clients_without_byzantine():
    ids, byz = place_clients(2, 3)
    assert ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert not bool(byz.any())


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(clusters=2, honest_per_cluster=3, byzantine_total=-1), "byzantine.total"),
        (dict(clusters=2, honest_per_cluster=3, byzantine_per_cluster=-2), "byzantine.per_cluster"),
        (dict(clusters=0, honest_per_cluster=3), "clusters"),
        (dict(clusters=2, honest_per_cluster=0), "honest_per_cluster"),
    ],
)
def test_place_clients_rejects_bad_counts_naming_the_field(kwargs, field):
    with pytest.raises(ValueError) as info:
        place_clients(**kwargs)
    assert field in str(info.value)


# -- the synthetic task ---------------------------------------------------------------------
def test_synthetic_optima_solve_every_clients_noiseless_data():
    task = small_task(seed=2, byzantine_total=2, clusters=3)
    optima = task.optima.double()
    assert optima.shape == (3, 5)
    for data in (task.train, task.validation, task.test):
        a, y = data.inputs.double(), data.targets.double()
        predicted = torch.einsum("nsd,nd->ns", a, optima[task.cluster_ids])
        torch.testing.assert_close(predicted, y, rtol=1e-12, atol=1e-9)
    # the local loss is zero at the own cluster's optimum ...
    at_own = task.objective.paired_losses(optima[task.cluster_ids], task.train)
    assert float(at_own.abs().max()) < 1e-12
    # ... and not at another cluster's (the clusters are genuinely different tasks)
    assert torch.unique(optima, dim=0).shape[0] == 3
    other = optima[(task.cluster_ids + 1) % 3]
    assert float(task.objective.paired_losses(other, task.train).min()) > 1e-3


def test_synthetic_feature_means_follow_cluster_index():
    task = small_task(seed=0, byzantine_total=0, clusters=3, validation_samples=200)
    inputs = task.validation.inputs
    for k in range(3):
        mean = float(inputs[task.cluster_ids == k].mean())
        # 3 clients x 200 samples x 5 features: standard error ~ 0.018
        assert abs(mean - k) < 0.15, (k, mean)


def test_synthetic_binary_optima_are_scaled_zero_one():
    task = small_task(seed=0, scale=7.0)
    values = set(task.optima.flatten().tolist())
    assert values <= {0.0, 7.0}


def test_synthetic_same_seed_same_data_other_seed_other_data():
    a, b, c = small_task(seed=11), small_task(seed=11), small_task(seed=12)
    for split in ("train", "validation", "test"):
        for field in ("inputs", "targets"):
            x, y, z = (getattr(getattr(t, split), field) for t in (a, b, c))
            assert torch.equal(x, y), (split, field)
            assert not torch.equal(x, z), (split, field)
    assert torch.equal(a.optima, b.optima)
    assert torch.equal(a.cluster_ids, b.cluster_ids) and torch.equal(a.byzantine, b.byzantine)


def test_synthetic_noise_and_dtype():
    noisy = small_task(seed=0, noise=0.5, dtype=torch.float32)
    assert noisy.train.inputs.dtype == torch.float32 and noisy.train.targets.dtype == torch.float32
    a, y = noisy.train.inputs.double(), noisy.train.targets.double()
    residual = y - torch.einsum("nsd,nd->ns", a, noisy.optima.double()[noisy.cluster_ids])
    assert float(residual.abs().max()) > 1e-2  # label noise is really added


# -- group_mean -----------------------------------------------------------------------------
def hand_group_mean(messages, groups, count, include=None):
    d = messages.shape[1]
    means = torch.zeros(count, d, dtype=messages.dtype)
    sizes = torch.zeros(count, dtype=messages.dtype)
    for k in range(count):
        rows = [j for j in range(messages.shape[0])
                if int(groups[j]) == k and (include is None or bool(include[j]))]
        sizes[k] = len(rows)
        if rows:
            means[k] = torch.stack([messages[j] for j in rows]).sum(0) / len(rows)
    return means, sizes


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    d=st.integers(1, 4),
    count=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    use_include=st.booleans(),
)
def test_group_mean_equals_hand_loop(n, d, count, seed, use_include):
    g = torch.Generator().manual_seed(seed)
    messages = torch.randn(n, d, generator=g, dtype=torch.float64)
    groups = torch.randint(0, count, (n,), generator=g)
    include = torch.rand(n, generator=g) < 0.7 if use_include else None
    means, sizes = group_mean(messages, groups, count, include)
    expected_means, expected_sizes = hand_group_mean(messages, groups, count, include)
    torch.testing.assert_close(sizes, expected_sizes)
    torch.testing.assert_close(means, expected_means, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf, 1e308])
def test_group_mean_ignores_excluded_non_finite_rows(poison):
    g = torch.Generator().manual_seed(0)
    messages = torch.randn(6, 3, generator=g, dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 0])
    include = torch.tensor([True, False, True, True, True, True])
    messages[1] = poison  # excluded row of group 0
    means, sizes = group_mean(messages, groups, 4, include)
    assert torch.isfinite(means).all()
    expected, expected_sizes = hand_group_mean(messages, groups, 4, include)
    torch.testing.assert_close(means, expected, rtol=1e-12, atol=1e-12)
    assert sizes.tolist() == [2.0, 2.0, 1.0, 0.0]
    assert torch.equal(means[3], torch.zeros(3, dtype=torch.float64))  # empty group


# -- HeavyBall ------------------------------------------------------------------------------
def test_heavy_ball_skips_and_counts_non_finite_rows():
    params = torch.zeros(4, 2, dtype=torch.float64)
    opt = HeavyBall(lr=0.5, momentum=0.0, like=params)
    update = torch.tensor([[1.0, 2.0], [math.nan, 0.0], [3.0, math.inf], [-2.0, 4.0]], dtype=torch.float64)
    opt.apply(params, update)
    expected = torch.tensor([[-0.5, -1.0], [0.0, 0.0], [0.0, 0.0], [1.0, -2.0]], dtype=torch.float64)
    assert torch.equal(params, expected)
    assert opt.skipped == 2
    # a further non-finite update on a subset of rows
    opt.apply(params, torch.tensor([[-math.inf, 0.0], [2.0, 2.0]], dtype=torch.float64), rows=torch.tensor([0, 2]))
    assert opt.skipped == 3
    assert torch.equal(params[0], expected[0])
    assert torch.equal(params[2], torch.tensor([-1.0, -1.0], dtype=torch.float64))
    assert torch.equal(params[[1, 3]], expected[[1, 3]])


def test_heavy_ball_momentum_matches_hand_recursion():
    # m = mu m + v ; x -= lr m, row-wise, with a row subset in the second step
    params = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    opt = HeavyBall(lr=0.1, momentum=0.5, like=params)
    opt.apply(params, torch.tensor([[2.0], [4.0]], dtype=torch.float64))
    # m = [2, 4]; x = [1 - 0.2, 2 - 0.4]
    torch.testing.assert_close(params, torch.tensor([[0.8], [1.6]], dtype=torch.float64))
    opt.apply(params, torch.tensor([[6.0]], dtype=torch.float64), rows=torch.tensor([1]))
    # row 1: m = 0.5 * 4 + 6 = 8; x = 1.6 - 0.8 = 0.8 ; row 0 untouched (m stays 2)
    torch.testing.assert_close(params, torch.tensor([[0.8], [0.8]], dtype=torch.float64))
    opt.apply(params, torch.tensor([[0.0], [0.0]], dtype=torch.float64))
    # m = [1, 4]; x = [0.8 - 0.1, 0.8 - 0.4]
    torch.testing.assert_close(params, torch.tensor([[0.7], [0.4]], dtype=torch.float64))
    assert opt.skipped == 0


@pytest.mark.parametrize(
    "start, lr, momentum, steps",
    [
        (-3e38, 1.0, 0.0, 1),  # the step itself overflows the parameter
        # a 1e38 row let through four times: the momentum buffer 1e38, 1.9e38, 2.71e38,
        # 3.44e38 overflows float32 (max 3.40e38), even with a small learning rate
        (0.0, 1e-3, 0.9, 4),
    ],
    ids=["param-overflow", "buffer-overflow"],
)
def test_heavy_ball_never_writes_non_finite_parameters(start, lr, momentum, steps):
    """HeavyBall's docstring: "whatever a defense lets through, no NaN or Inf ever reaches
    a parameter row".  Finite but huge updates (a 1e38 Byzantine row averaged in float32
    is finite) must not turn a parameter row into +-Inf either."""
    params = torch.tensor([[start, 1.0]], dtype=torch.float32)
    opt = HeavyBall(lr=lr, momentum=momentum, like=params)
    update = torch.tensor([[3e38 if start else 1e38, 0.0]], dtype=torch.float32)
    assert torch.isfinite(update).all()
    for _ in range(steps):
        opt.apply(params, update)
    assert torch.isfinite(params).all(), f"parameter row became {params.tolist()}"


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6),
    st.sampled_from([0.0, 0.5, 0.9]),
    st.lists(st.sampled_from([0.0, 1.0, -2.5, 1e37, 1e38, math.nan, math.inf]), min_size=6, max_size=6),
    st.sampled_from([1.0, 3e37]),
    st.sampled_from([None, 3e38, -3.3e38]),
    st.booleans(),
    st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
)
def test_heavy_ball_whole_tensor_step_equals_the_row_subset_step(rows, momentum, values, scale, written, in_buffer,
                                                                 dtype):
    """The whole-tensor path (in place when no row can fail the check, else reused
    scratch buffers and a swapped momentum buffer) and the row-subset path are one
    rule: the same parameters, buffer and skip count after three steps, with hostile
    update rows, parameters near float32's overflow, and a parameter (or momentum)
    entry written by someone else between two steps (a bound carried from the last
    step must then not be used)."""
    g = torch.Generator().manual_seed(rows)
    largest = torch.finfo(dtype).max  # parameters start finite in every dtype
    start = (torch.randn(rows, 3, generator=g, dtype=torch.float64) * scale).clamp(-largest, largest).to(dtype)
    update = torch.tensor(values[: rows * 3] + [0.0] * max(0, rows * 3 - 6), dtype=torch.float64).to(dtype)
    update = update[: rows * 3].reshape(rows, 3)
    whole, subset = start.clone(), start.clone()
    opt_whole = HeavyBall(0.1, momentum, whole)
    opt_subset = HeavyBall(0.1, momentum, subset)
    for step, factor in enumerate((1.0, -0.5, 2.0)):
        if step == 2 and written is not None:
            for params, opt in ((whole, opt_whole), (subset, opt_subset)):
                (opt.buffer if in_buffer and momentum else params)[-1, 0] = max(min(written, largest), -largest)
        opt_whole.apply(whole, update * factor)
        opt_subset.apply(subset, update * factor, rows=torch.arange(rows))
    assert torch.equal(whole, subset)
    assert opt_whole.skipped == opt_subset.skipped
    if momentum:
        assert torch.equal(opt_whole.buffer, opt_subset.buffer)
    assert torch.isfinite(whole).all()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.9]),
    st.sampled_from([0.0, 1.0, -2.5, 1e38, -3e38, math.nan, math.inf]),
    st.sampled_from([1.0, 3e37, 3e38]),
    st.integers(0, 1000),
    st.booleans(),
    st.sampled_from([None, 1.0, 3e38, -3.3e38]),
)
def test_heavy_ball_gathered_step_equals_apply(rows, k, momentum, hostile, scale, seed, keep, written):
    """``apply_gathered`` (MC's in-place step from K centres) is ``apply`` on the
    gathered rows: same parameters, buffer and skip count, with hostile centres and
    parameters near float32's overflow, with or without keeping the gathered rows, and
    when something else writes a parameter between two steps (the bound on ``max|x|``
    carried from the last step must then not be used)."""
    g = torch.Generator().manual_seed(seed)
    params = torch.randn(rows, 4, generator=g) * scale
    source = torch.randn(k, 4, generator=g)
    source[0, 1] = hostile
    index = torch.randint(0, k, (rows,), generator=g)
    gathered, plain = params.clone(), params.clone()
    opt_gathered, opt_plain = HeavyBall(0.5, momentum, gathered), HeavyBall(0.5, momentum, plain)
    for step in range(3):
        if step == 2 and written is not None:
            gathered[-1, 0] = plain[-1, 0] = written
        returned = opt_gathered.apply_gathered(gathered, source, index, torch.empty(rows, 4) if keep else None)
        if keep:
            assert torch.equal(returned.view(torch.int32), source[index].view(torch.int32))  # NaN too
        else:
            assert returned is None
        opt_plain.apply(plain, source[index])
    assert torch.equal(gathered, plain)
    assert opt_gathered.skipped == opt_plain.skipped
    assert torch.equal(opt_gathered.buffer, opt_plain.buffer)


def test_heavy_ball_with_a_negative_rate_still_skips_what_would_overflow():
    """The in-place step's bounds add the learning rate as it is: a negative one (no
    validated config sets it, the class accepts it) must take the checked path."""
    params = torch.tensor([[1.6e38]])
    opt = HeavyBall(-1.5, 0.0, params)
    opt.apply(params, params.clone())  # 1.6e38 + 1.5 * 1.6e38 overflows
    assert torch.isfinite(params).all() and opt.skipped == 1


def test_heavy_ball_gathered_step_rechecks_parameters_written_by_someone_else():
    """The in-place step carries a bound on ``max|x|`` between steps; a parameter
    written in between (here to near float32's maximum) must be seen, so that a small
    update that overflows it is still skipped instead of writing Inf."""
    params = torch.zeros(2, 1)
    opt = HeavyBall(1.0, 0.0, params)
    index = torch.zeros(2, dtype=torch.long)
    opt.apply_gathered(params, torch.ones(1, 1), index)
    assert torch.equal(params, torch.full((2, 1), -1.0))
    params[0, 0] = 3.4e38
    opt.apply_gathered(params, torch.tensor([[-1e36]]), index)  # 3.4e38 + 1e36 overflows
    assert torch.isfinite(params).all()
    assert opt.skipped == 1 and float(params[0, 0]) == pytest.approx(3.4e38, rel=1e-6)
    assert float(params[1, 0]) == pytest.approx(1e36, rel=1e-6)


def test_deliver_into_a_reused_buffer_equals_a_fresh_copy():
    task = small_task()
    attack = attacks.build("large_gradient", {"mean": 5.0, "std": 1.0})
    messages = torch.randn(task.train.inputs.shape[0], 4, dtype=torch.float64)
    original = messages.clone()
    buffer = torch.full_like(messages, math.nan)
    fresh = federation(task, attack, seed=3).deliver(messages, 0, "gradient")
    reused = federation(task, attack, seed=3).deliver(messages, 0, "gradient", out=buffer)
    assert reused.data_ptr() == buffer.data_ptr()
    assert torch.equal(reused, fresh)
    assert torch.equal(messages, original)  # the caller's messages are untouched


@pytest.mark.parametrize("mode", ["fresh", "out", "inplace"])
@pytest.mark.parametrize("byzantine_rows", [[4, 5], [1, 4]], ids=["block", "scattered"])
def test_deliver_drawing_in_place_equals_the_call_path(mode, byzantine_rows, call_path_attack):
    """With a Byzantine block and an attack that reads nothing, deliver lets the
    attack draw straight into the delivered tensor; the delivered messages are those of
    the call-and-scatter path, bit for bit, and the caller's messages are untouched
    unless delivered in place."""
    task = small_task()
    byzantine = torch.zeros(task.train.inputs.shape[0], dtype=torch.bool)
    byzantine[byzantine_rows] = True
    attack = attacks.build("large_gradient", {"mean": 5.0, "std": 1.0})
    results = []
    for chosen in (attack, call_path_attack(attack, reads_messages=False)):
        fed = Federation(task.objective, task.train, task.cluster_ids, byzantine, 3, 3, chosen)
        messages = torch.randn(3, byzantine.numel(), 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        original = messages.clone()
        kwargs = {"inplace": True} if mode == "inplace" else {"out": torch.empty_like(messages)} if mode == "out" else {}
        delivered = fed.deliver(messages, 0, "cross_gradient", **kwargs)
        assert torch.equal(delivered[:, ~byzantine], original[:, ~byzantine])
        if mode != "inplace":
            assert torch.equal(messages, original)
        results.append(delivered.clone())
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("byzantine_rows", [[4, 5], [0, 1], [2, 3], [1, 4]], ids=["tail", "head", "middle", "scattered"])
@pytest.mark.parametrize("reads", [False, True])
def test_gradients_skip_unread_byzantine_rows_only_when_safe(byzantine_rows, reads, call_path_attack):
    """``skip_unread=True`` computes only the honest rows when the attack reads nothing
    and the Byzantine rows are one block; honest rows equal the full computation and
    the Byzantine rows of ``out`` are left untouched.  Otherwise every row is computed."""
    task = small_task()
    n = task.train.inputs.shape[0]
    byzantine = torch.zeros(n, dtype=torch.bool)
    byzantine[byzantine_rows] = True
    attack = attacks.build("large_gradient")
    if reads:
        attack = call_path_attack(attack, reads_messages=True)
    fed = Federation(task.objective, task.train, task.cluster_ids, byzantine, 0, 3, attack)
    params = torch.randn(n, task.objective.dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    batch = fed.sample_batch()
    full = fed.gradients(params, batch)
    out = torch.full_like(full, 7.0)
    fed.gradients(params, batch, out=out, skip_unread=True)
    torch.testing.assert_close(out[~byzantine], full[~byzantine], rtol=1e-12, atol=1e-12)
    skipped = not reads and byzantine_rows != [1, 4]
    if skipped:
        assert bool((out[byzantine] == 7.0).all())
    else:
        torch.testing.assert_close(out[byzantine], full[byzantine], rtol=1e-12, atol=1e-12)


class _ReverseLabels(AttackBase):
    """A stub data attack: poisons labels, then sends honest rows."""

    name = "stub_reverse"

    def poison(self, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
        return num_classes - 1 - targets

    def __call__(self, messages, context):
        return messages[..., context.byzantine, :].clone()


def _poisoned_federation():
    """4 clients (the last 2 Byzantine) with labels 0, 1, 2 under label reversal."""
    inputs = torch.zeros(4, 3, 2)
    targets = torch.tensor([[0, 1, 2]] * 4)
    byzantine = torch.tensor([False, False, True, True])
    fed = Federation(
        linear_regression(2), ClientData(inputs, targets), torch.zeros(4, dtype=torch.long), byzantine,
        attack=_ReverseLabels(), num_classes=3,
    )
    return inputs, targets, fed


def test_data_attack_poisons_only_byzantine_training_targets():
    inputs, targets, fed = _poisoned_federation()
    assert torch.equal(fed.train.targets[:2], targets[:2])
    assert torch.equal(fed.train.targets[2:], torch.tensor([[2, 1, 0]] * 2))
    assert torch.equal(targets, torch.tensor([[0, 1, 2]] * 4))  # caller's data untouched


def test_data_attack_on_regression_task_is_refused():
    task = small_task()
    with pytest.raises(ValueError, match="classification task"):
        Federation(task.objective, task.train, task.cluster_ids, task.byzantine, attack=_ReverseLabels())


def test_redeal_replaces_training_data_and_repoisons_byzantine_rows():
    inputs, targets, fed = _poisoned_federation()
    fresh = torch.tensor([[1, 1, 0]] * 4)
    fed.redeal(ClientData(inputs + 1, fresh))
    assert torch.equal(fed.train.inputs, inputs + 1)
    assert torch.equal(fed.train.targets[:2], fresh[:2])
    assert torch.equal(fed.train.targets[2:], torch.tensor([[1, 1, 2]] * 2))
    with pytest.raises(ValueError, match="same shapes"):
        fed.redeal(ClientData(inputs[:, :2], fresh[:, :2]))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_heavy_ball_loads_state_saved_with_an_eager_buffer(momentum):
    """A checkpoint's optimiser state from before the buffer became lazy (a plain
    ``buffer`` entry) loads into the same state: same buffer, same next step."""
    g = torch.Generator().manual_seed(1)
    params = torch.randn(3, 4, generator=g, dtype=torch.float64)
    reference = HeavyBall(0.1, momentum, params)
    reference.apply(params.clone(), torch.randn(3, 4, generator=g, dtype=torch.float64))
    state = copy.deepcopy(reference.__getstate__())  # a loaded checkpoint shares no tensor
    state["buffer"] = state.pop("_buffer") if state["_buffer"] is not None else torch.zeros_like(params)
    del state["_like"]
    loaded = HeavyBall.__new__(HeavyBall)
    loaded.__setstate__(state)
    assert torch.equal(loaded.buffer, reference.buffer)
    update = torch.randn(3, 4, generator=g, dtype=torch.float64)
    a, b = params.clone(), params.clone()
    reference.apply(a, update)
    loaded.apply(b, update)
    assert torch.equal(a, b)
