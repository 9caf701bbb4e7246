"""Which method, backbone and detector can train together.

A method's objective (`MethodSpec.needs`) and a detector (`Detector.needs`) name the backbone
outputs they read; a backbone names what it provides (`provides`, methods/backbones/api.py
OUTPUTS). `check_fit` refuses a combination whose needs the backbone does not provide, in
one line that names the fix, before any data is made.
"""

from __future__ import annotations

from prvr.harness.io import UserError
from prvr.harness.registry import BACKBONES, DETECTORS, METHODS
from prvr.methods.backbones.api import OUTPUTS, missing_outputs


def fitting_backbones(needs: frozenset[str] | set[str]) -> list[str]:
    """The registered backbones that provide every one of `needs`, sorted."""
    return [b for b in BACKBONES.names() if not missing_outputs(needs, BACKBONES.get(b))]


def check_fit(method: str, backbone: str, detector: str) -> None:
    """Raise UserError when `backbone` lacks an output that `method`'s objective or `detector` needs."""
    spec, backbone_cls = METHODS.get(method), BACKBONES.get(backbone)
    detector_needs = _needs(detector)
    fits = fitting_backbones(spec.needs | detector_needs)
    pick = spec.backbone if spec.backbone in fits else (fits[0] if fits else "")
    switch = f"--backbone {pick} (backbones that fit method '{method}' and detector '{detector}': {', '.join(fits)})"
    missing = missing_outputs(spec.needs, backbone_cls)
    if missing:
        fix = f"use {switch}" if pick else f"no registered backbone fits method '{method}' with detector '{detector}'"
        raise UserError(f"method '{method}' cannot train backbone '{backbone}': its objective needs "
                        f"{_described(missing)}, which '{backbone}' does not provide; {fix}")
    missing = missing_outputs(detector_needs, backbone_cls)
    if missing:
        other = spec.relations if not missing_outputs(_needs(spec.relations), backbone_cls) else "none"
        fix = f"use --set relations.name={other}" + (f", or {switch}" if pick else "")
        raise UserError(f"detector '{detector}' cannot read backbone '{backbone}': it needs {_described(missing)}, "
                        f"which '{backbone}' does not provide; {fix}")


def _needs(detector: str) -> frozenset[str]:
    return getattr(DETECTORS.get(detector), "needs", frozenset())


def _described(names: list[str]) -> str:
    return " and ".join(f"{n} ({OUTPUTS.get(n, 'not a known output')})" for n in names)
