"""`python -m coordinator ...` is `infer-cluster ...` (used by `serve` to start children)."""

from .cli import main

main()
