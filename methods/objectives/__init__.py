"""Objectives (prvr.methods.objectives): pure loss functions."""

from prvr.methods.objectives import ranking  # noqa: F401
from prvr.methods.objectives import prvr  # noqa: F401
from prvr.methods.objectives import arl  # noqa: F401
