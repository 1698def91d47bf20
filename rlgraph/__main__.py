"""`python -m rlgraph ...` is the `rlgraph` command."""

import sys

from rlgraph.cli.main import main

sys.exit(main())
