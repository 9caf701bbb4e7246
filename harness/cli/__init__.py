"""The commands: the top floor of the harness. `prvr-bench` is `main` (harness/cli/app.py);
`python -m prvr.harness.cli` runs it too."""

from prvr.harness.cli.app import main

__all__ = ["main"]
