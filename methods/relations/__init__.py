"""Relation detectors (prvr.methods.relations)."""

from prvr.methods.relations.base import Detector, Relations  # noqa: F401
from prvr.methods.relations import arl  # noqa: F401
