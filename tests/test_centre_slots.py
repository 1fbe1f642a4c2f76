"""Momentum- and Myopic-Clustering keep K free rows ahead of their [N, d] buffers, where
the starting centres are put so that the pairwise evaluation takes their products in
the points' Gram product.  That layout changes cost, never results, and never writes
outside the algorithm's own buffers."""

from __future__ import annotations

import pytest
import torch

import attacks
from defenses import build, pairwise_clustering
from defenses.clustering_algorithms import ALG4_PRINTED_RULES
from robust_pfl import ClientData, Federation, mlp

K = 3


def _federation(attack: str) -> Federation:
    g = torch.Generator().manual_seed(4)
    clients, samples = 21, 6  # more than 16 points: the Gram product is split too
    data = ClientData(
        torch.rand(clients, samples, 20, generator=g, dtype=torch.float64),
        torch.randint(0, 3, (clients, samples), generator=g),
    )
    byzantine = torch.zeros(clients, dtype=torch.bool)
    byzantine[-2:] = True
    options = {"mean": 50.0, "std": 5.0} if attack == "large_gradient" else {}
    return Federation(
        mlp(20, (64,), 3), data, torch.arange(clients) % K, byzantine, seed=2, batch_size=4,
        attack=attacks.build(attack, options),
    )


def _run(name: str, attack: str, use_slots: bool, rounds: int = 5, monkeypatch=None):
    """The algorithm after ``rounds`` rounds, and for each clustering whether the
    pairwise evaluation joined the centres to the points (``use_slots``; needs
    ``monkeypatch`` to spy on the evaluation)."""
    fed = _federation(attack)
    # Alg. 4's printed rules: the pairwise evaluation has no cells (MC's default cell
    # balls take the gram evaluation), and the challenger clusters a sample of its own
    algorithm = build(name, fed, {"lr": 0.05, "radius": {"policy": "quantile", "q": 0.3}, "method": "pairwise",
                                  **ALG4_PRINTED_RULES})
    joined: list[bool] = []
    if not use_slots:
        algorithm._centres_in_slot = lambda received, centres: centres
    elif monkeypatch is not None:
        original = pairwise_clustering._stacked_ahead

        def spy(centres, z):
            view = original(centres, z)
            joined.append(view is not None)
            return view

        monkeypatch.setattr(pairwise_clustering, "_stacked_ahead", spy)
    for t in range(rounds):
        algorithm.step(t)
    return algorithm, joined


@pytest.mark.parametrize("name", ["mc", "myopic"])
@pytest.mark.parametrize("attack", ["large_gradient", "alie"])
def test_centre_slots_change_no_result(name, attack, monkeypatch):
    """With the centres in the slot ahead of the received rows, the pairwise
    evaluation joins them to the points in every round (for an attack that overwrites
    its rows unread and for one that reads them), and the models, centres and
    assignments are those of the run with the centres held apart."""
    slotted, joined = _run(name, attack, use_slots=True, monkeypatch=monkeypatch)
    monkeypatch.undo()
    apart, _ = _run(name, attack, use_slots=False)
    assert joined and all(joined)
    torch.testing.assert_close(slotted.client_models(), apart.client_models(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(slotted.centres, apart.centres, rtol=1e-12, atol=1e-12)
    assert torch.equal(slotted.assignment, apart.assignment)


def test_probing_a_foreign_buffer_writes_nothing_around_it():
    """An adaptive attack's probe clusters messages it owns; rows ahead of them in the
    same storage are not the algorithm's slot and stay untouched."""
    algorithm, _ = _run("mc", "large_gradient", use_slots=True, rounds=2)
    messages = algorithm.momenta.clone()
    whole = torch.cat([torch.full((K, messages.shape[1]), 7.0, dtype=messages.dtype), messages])
    algorithm._probe(whole[K:])
    assert bool((whole[:K] == 7.0).all())
    assert torch.equal(whole[K:], messages)
