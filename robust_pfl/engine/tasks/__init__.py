"""Clustered tasks: data, objective and hidden clusters of a federation."""

from robust_pfl.engine.tasks.base import Task, place_clients
from robust_pfl.engine.tasks.images import ImageTask
from robust_pfl.engine.tasks.synthetic import SyntheticLinearRegression

__all__ = ["Task", "place_clients", "SyntheticLinearRegression", "ImageTask"]
