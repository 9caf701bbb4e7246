"""Relation detectors (prvr.methods.relations)."""

from prvr.methods.relations.base import Detector, Relations  # noqa: F401
