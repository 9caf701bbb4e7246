"""Relation detectors (prvr.methods.relations); prvr.methods imports every module here, so each registers itself."""

from prvr.methods.relations.base import Detector, Relations  # noqa: F401
