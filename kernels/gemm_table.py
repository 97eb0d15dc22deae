"""Launch configs for `kernels.gemm.linear_mid`, written by `bench/gemm.py --sweep` on an H200.

Owns: TABLE, keyed (N, K, 64-row tiles of M) -> GemmConfig, or None where cuBLAS stayed ahead.
Plain data: paste the sweep's output here; shapes not listed stay on cuBLAS. Never put logic here.
"""

from .gemm_gluon import GemmConfig  # noqa: F401  (entries are GemmConfig(...) literals)

TABLE: dict = {
}
