"""Dataset adapters (prvr.datasets): the simulated PRVR world and the real public layouts."""

from prvr.datasets import real, sim  # noqa: F401  (register tvr, activitynet, charades, sim-tvr, ...)
