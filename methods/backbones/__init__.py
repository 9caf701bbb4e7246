"""Backbones (prvr.methods.backbones); prvr.methods imports every module here, so each registers itself."""
