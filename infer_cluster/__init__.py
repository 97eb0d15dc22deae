"""infer-cluster: a ZMQ-distributed, multi-process LLM serving cluster.

Owns: the public names (`LLM`, `SamplingParams`, `InferenceClient`, ...) and the `infer-cluster`
CLI (`cli*.py`, `launcher.py`, `loadgen.py`), which is the composition root: it starts
coordinators, replicas and gateways, so it may reach every subpackage.

The installed distribution maps the repository's folders under this namespace (setup.cfg's
`package_dir`): `infer_cluster.protocol`, `.client`, `.coordinator`, `.worker`, `.kernels`, `.gateway`.
Exports are lazy: `from infer_cluster import InferenceClient, SamplingParams` never imports
torch; only `LLM` and the engine names load the worker side. To export a new name, add it to
`_EXPORTS` with the module that defines it.
"""

from __future__ import annotations

import importlib
import os

__version__ = "0.2.0"

# A source checkout on sys.path (no install): the subpackages sit beside this folder.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (os.path.isfile(os.path.join(_ROOT, "setup.cfg"))
        and os.path.isfile(os.path.join(_ROOT, "protocol", "__init__.py"))
        and _ROOT not in __path__):
    __path__.append(_ROOT)

_EXPORTS = {
    "SamplingParams": "infer_cluster.protocol",
    "RequestOutput": "infer_cluster.protocol",
    "RequestDelta": "infer_cluster.protocol",
    "FinishReason": "infer_cluster.protocol",
    "InferClusterError": "infer_cluster.protocol",
    "InvalidRequestError": "infer_cluster.protocol",
    "InferenceClient": "infer_cluster.client",
    "AsyncInferenceClient": "infer_cluster.client",
    "RequestHandle": "infer_cluster.client",
    "LLM": "infer_cluster.worker",
    "EngineConfig": "infer_cluster.worker",
    "DynamicEngine": "infer_cluster.worker",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'infer_cluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
