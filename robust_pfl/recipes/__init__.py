"""Reproductions of the papers' figures and tables (composition root)."""
