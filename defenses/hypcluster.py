"""HypCluster (Mansour, Mohri, Ro, Suresh 2020, "Three Approaches for Personalization
with Applications to Federated Learning", Sec. 3, Alg. 1 HypCluster).

K hypotheses.  Every round each client is assigned the hypothesis with the lowest loss
on its local training data, runs SGD from it, and the server averages the local
models per hypothesis.  Werner et al. (2023, Sec. 2.1) call it the centralised form of
IFCA's Option II and show it stays stuck on the same example as IFCA.

It is built on :class:`defenses.ifca.IFCAModelAveraging` and differs in one choice:
the assignment is the argmin of each client's loss on its *full local training set*
(HypCluster's ``argmin_k L_{D_i}(h_k)``), not on the round's batch as IFCA's
clients do.  The local steps, the per-hypothesis mean of the admissible received
models and the attack surface are IFCA Option II's (``docs/cfl.md``).
"""

from __future__ import annotations

from typing import Any

from defenses.base import register
from defenses.ifca import IFCAModelAveraging, IFCAModelAveragingParams
from robust_pfl.engine.data import Batch


class HypClusterParams(IFCAModelAveragingParams):
    """IFCA Option II's parameters: ``clusters`` (K hypotheses, default the task's K)
    and ``local_steps``."""


@register
class HypCluster(IFCAModelAveraging):
    """HypCluster (Mansour et al. 2020, Alg. 1): IFCA Option II whose clients pick the
    hypothesis of lowest loss on all their training data.

    Every client takes part in every round (the paper samples clients; the testbed's
    clients all participate, as in IFCA here).  The choice costs ``K x n`` loss
    evaluations per client per round (``n`` local samples); the local steps use the
    round's batches as IFCA's do.
    """

    name = "hypcluster"
    summary = "HypCluster: K hypotheses, each client takes the lowest loss on its full local data, local SGD, averaging"
    reference = "Mansour, Mohri, Ro, Suresh 2020, Three Approaches for Personalization, Alg. 1 HypCluster"
    Params = HypClusterParams

    def _choose(self, batch: Batch, *args: Any, **kwargs: Any) -> None:
        """IFCA's choice (whatever it does with the losses), on the full local data."""
        super()._choose(self.federation.train, *args, **kwargs)
