"""The replica side: engine, scheduler, KV blocks, model runner, sampler, models, offline `LLM`.

`from worker import LLM` is the offline API. Heavy modules (torch) load on first use of these
names, so `worker.config` stays importable without torch.
"""

__all__ = ["LLM", "EngineConfig", "DynamicEngine"]


def __getattr__(name):
    if name == "LLM":
        from infer_cluster.worker.llm import LLM
        return LLM
    if name == "EngineConfig":
        from infer_cluster.worker.config import EngineConfig
        return EngineConfig
    if name == "DynamicEngine":
        from infer_cluster.worker.engine.engine import DynamicEngine
        return DynamicEngine
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
