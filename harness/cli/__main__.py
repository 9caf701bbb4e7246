"""`python -m prvr.harness.cli ARGS`: the `prvr-bench` command."""

import sys

from prvr.harness.cli.app import main

sys.exit(main())
