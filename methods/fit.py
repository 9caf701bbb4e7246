"""Which method, backbone and detector can train together.

A method's objective (`MethodSpec.needs`) and a detector (`Detector.needs`) name the backbone
outputs they read; a backbone names what it provides (`provides`, methods/backbones/api.py
OUTPUTS). `check_fit` refuses a combination whose needs the backbone does not provide, in
one line that names the fix, before any data is made.
"""

from __future__ import annotations

from prvr.harness.base.contract import MethodSpec
from prvr.harness.base.io import UserError
from prvr.harness.base.registry import BACKBONES, DETECTORS, METHODS, extended_home
from prvr.methods.backbones.api import OUTPUTS, missing_outputs


def method_needs(spec: MethodSpec, backbone: str) -> frozenset[str] | None:
    """What `spec`'s objective reads from `backbone`: its own needs, and for a method that
    extends its backbone's home method, the home method's too (None: no home method)."""
    if not spec.extends_backbone:
        return spec.needs
    home = extended_home(spec, backbone)
    return None if home is None else spec.needs | home.needs


def fitting_backbones(spec: MethodSpec, detector_needs: frozenset[str] = frozenset()) -> list[str]:
    """The registered backbones that provide every output the method and detector read, sorted."""
    out = []
    for b in BACKBONES.names():
        needs = method_needs(spec, b)
        if needs is not None and not missing_outputs(needs | detector_needs, BACKBONES.get(b)):
            out.append(b)
    return out


def check_fit(method: str, backbone: str, detector: str) -> None:
    """Raise UserError when `backbone` lacks an output that `method`'s objective or `detector` needs."""
    spec, backbone_cls = METHODS.get(method), BACKBONES.get(backbone)
    detector_needs = _needs(detector)
    fits = fitting_backbones(spec, detector_needs)
    pick = spec.backbone if spec.backbone in fits else (fits[0] if fits else "")
    switch = f"--backbone {pick} (backbones that fit method '{method}' and detector '{detector}': {', '.join(fits)})"
    needs = method_needs(spec, backbone)
    if needs is None:
        raise UserError(f"method '{method}' extends the method of its backbone, and backbone '{backbone}' has none "
                        f"to extend; use {switch}")
    missing = missing_outputs(needs, backbone_cls)
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
