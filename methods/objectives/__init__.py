"""Objectives (prvr.methods.objectives): pure loss functions."""

from prvr.methods.objectives import ranking  # noqa: F401
