"""The package version, in a module of its own so that provenance records can read it
without importing the package front (which imports the whole engine)."""

__version__ = "0.1.0"
