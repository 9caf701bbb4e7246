"""Dataset adapters (prvr.datasets): the simulated PRVR world and, later, real layouts."""

from prvr.datasets import sim  # noqa: F401  (registers sim-tvr, sim-activitynet, ...)
