"""`python -m infer_cluster ...` is `infer-cluster ...` (also how `serve` starts its children)."""

import sys

from infer_cluster.cli import main

sys.exit(main(prog_name="infer-cluster"))
