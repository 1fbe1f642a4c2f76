"""Theory checks for Werner et al., "Provably Personalized and Robust Federated
Learning": estimators of the constants A, D, Delta, sigma, L, mu from real runs
(:mod:`theory_checks.estimators`), the bounds as functions of those constants
(:mod:`theory_checks.bounds`), the paper's statements as machine checks
(:mod:`theory_checks.statements`), scaling studies (:mod:`theory_checks.scaling`)
and the Markdown report (:mod:`theory_checks.report`).

Dependency direction: this package reads the core (:mod:`robust_pfl`) and
:mod:`defenses`; only the composition root (``robust_pfl.cli``,
``robust_pfl.experiments``, the recipes) imports it.

The public checking API, for a notebook or a script: :func:`check` runs one registered
statement, :func:`check_bound` a bound of your own on random instances (search, then
shrink the counterexample), :func:`check_rate` a rate of your own from measurements
(see :mod:`theory_checks.api`).
"""

from theory_checks.api import check, check_bound, check_rate  # noqa: E402

__all__ = ["check", "check_bound", "check_rate"]
