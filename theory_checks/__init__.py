"""Theory checks (estimators of A, D, Delta, sigma, L and statement checks).

Planned as their own issue.  The engine already exposes what they need: every round's
:class:`robust_pfl.types.RoundRecord` carries the per-client gradients, momenta and
updates, and :class:`robust_pfl.federation.Federation` evaluates ``g_j(x_i)`` for any
set of models.  Nothing is implemented here yet.
"""
