"""Model profiling (`prvr-bench profile`, `nox -s profile`): parameters, FLOPs per query,
inference runtime per query, training throughput and memory, evaluator speed.

Each figure is written to results/profile.{md,csv} with its protocol next to it; the papers'
own figures (prvr.harness.profiling.reported) stand beside ours as separate rows.
"""
