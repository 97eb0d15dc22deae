"""Launch configs for `linear_small`, tuned on the H100 with `bench/gemv.py --sweep` (bf16).

Owns: TUNED, keyed (N, K, M bucket) -> GemvConfig, or None where cuBLAS was faster. Plain data:
paste the sweep's output here; shapes not listed fall back to `gemv.default_config`. Never put
logic here.
"""

from .gemv_config import GemvConfig  # noqa: F401  (entries are GemvConfig(...) literals)

TUNED: dict = {
}
