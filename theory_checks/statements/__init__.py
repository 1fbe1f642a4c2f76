"""Werner et al.'s statements (main paper and workshop version) as checkable claims (see :mod:`.registry`).

Importing this package registers every statement; :func:`run_checks` runs them.
"""

from theory_checks.statements.registry import STATEMENTS, Budget, Statement, register, run_checks

# Importing the modules registers their statements (imported for that side effect).
from theory_checks.statements import clustering_steps, lemmas, false_claims, rates, workshop, other_papers  # noqa: E402,F401  isort: skip

__all__ = ["STATEMENTS", "Budget", "Statement", "register", "run_checks"]
