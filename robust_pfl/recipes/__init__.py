"""Reproductions of the papers' figures and tables (composition root).

One rule for every recipe's ``--quick`` (and ``attack-table --quick``): a smoke run
with fewer rounds, grid points and seeds, which exits 0 when it ran (1 only when a grid
cell errored) and says :func:`quick_sentence` instead of any verdict; only the full
run checks claims and exits 1 when one fails."""


def quick_sentence(what: str = "check the paper's claims") -> str:
    """The line every quick mode prints (and writes into its Markdown) instead of a verdict."""
    return f"quick mode: a smoke run; it decides no claim — run without --quick to {what}"


QUICK_SENTENCE = quick_sentence()
