"""Verdicts on claimed rates: what a fitted exponent with its bootstrap interval says
about the exponent a theorem claims for one variable (Werner et al., Thm 3.1, eq. 14;
Thm 3.3, eq. 23; Thm 3.4, eq. 28), and the status a rate check reports.

A rate claims ``error <~ C x^c``.  With the fitted exponent's interval ``[low, high]``,
the ratio ``error / x^c`` scales like ``x^r`` with ``r`` in ``[low - c, high - c]``:

* ``r`` entirely above :data:`EXPONENT_TOLERANCE`: the ratio grows without limit along
  the variable, so no constant covers every instance: **fails**, unless the variable
  is bounded on the theorem's domain (``beta_i <~ delta_i``), where a growing ratio
  stays bounded: **holds** (the constant absorbs it).
* ``r`` entirely below ``-EXPONENT_TOLERANCE``: the error falls faster (or grows
  slower) than claimed; the bound is loose there, which is no violation: **holds**.
* otherwise, when a decay is claimed (``c < -EXPONENT_TOLERANCE``; a smaller one is
  no decay within the tolerance) and the interval reaches 0, no decay: the data cannot
  tell the claimed rate from none: **inconclusive**; else **holds** (as claimed,
  within the tolerance).

The tolerance keeps a preasymptotic bend or a logarithmic factor, which a finite sweep
cannot tell from a power, from reading as a violation: a ratio that grows like
``x^0.03`` over the decade or two of a sweep has grown by 7-15%.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from theory_checks.types import Hypothesis, PowerLaw, RateVerdict, Status

#: Exponent departures from the claim within this are read as the claimed rate.
EXPONENT_TOLERANCE = 0.05


def rate_verdict(law: PowerLaw, claimed: float, bounded: bool = False) -> RateVerdict:
    """The verdict of ``law`` (fitted exponent and interval) on the ``claimed``
    exponent (see the module docstring); ``bounded``: the variable cannot grow without
    limit on the theorem's domain."""
    if not math.isfinite(claimed):
        return RateVerdict("fails", "the bound is not positive and finite where its rate is read: it claims no rate")
    low, high = law.low - claimed, law.high - claimed
    growth = f"error / x^({claimed:+.2f}) ~ x^{law.exponent - claimed:+.2f} [{low:+.2f}, {high:+.2f}]"
    shrinking, growing = ("decays faster", "decays slower") if claimed < 0 else ("grows slower", "grows faster")
    if low > EXPONENT_TOLERANCE:
        if bounded:
            return RateVerdict("holds", f"{growing} than claimed along a bounded variable, which the constant "
                                        f"covers ({growth})")
        return RateVerdict("fails", f"{growing} than claimed: no constant covers every x ({growth})")
    if high < -EXPONENT_TOLERANCE:
        return RateVerdict("holds", f"{shrinking} than claimed: the bound is loose ({growth})")
    if claimed < -EXPONENT_TOLERANCE and law.high >= 0:
        return RateVerdict("inconclusive", f"the interval [{law.low:+.2f}, {law.high:+.2f}] holds both the claimed "
                                           f"{claimed:+.2f} and no decay (0)")
    return RateVerdict("holds", f"as claimed, within {EXPONENT_TOLERANCE:g} ({growth})")


def rate_status(verdicts: Mapping[str, RateVerdict], hypotheses: Iterable[Hypothesis] = ()) -> Status:
    """A rate check's status: ``hypotheses_unmet`` when any hypothesis fails (the
    verdicts then decide nothing), else ``fails`` when some exponent fails,
    ``inconclusive`` when some cannot decide, and ``holds_with_constant`` otherwise."""
    if any(not hypothesis.holds for hypothesis in hypotheses):
        return "hypotheses_unmet"
    found = {verdict.verdict for verdict in verdicts.values()}
    if "fails" in found:
        return "fails"
    if "inconclusive" in found:
        return "inconclusive"
    return "holds_with_constant"
