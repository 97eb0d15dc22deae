"""Suite-wide test settings.

Hypothesis runs derandomized (a fixed example sequence per test), so CI is reproducible: a
property that fails, fails every time, and a pass is not luck of the draw.
"""

from hypothesis import settings

settings.register_profile("infer-cluster", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("infer-cluster")
