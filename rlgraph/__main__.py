"""`python -m rlgraph ...` is the `rlgraph` command."""

import sys

from rlgraph.cli import main

sys.exit(main())
