"""Objectives (prvr.methods.objectives): pure loss functions; prvr.methods imports every module here."""
