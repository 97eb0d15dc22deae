"""Which engines let the layer linears take the Gluon mid-size GEMM (kernels/gemm.py): one that
replays CUDA graphs may (its table decides per shape; its GPU figures are in bench/RESULTS.md,
"Mid-size GEMMs"), an eager one keeps cuBLAS, whose launches cost less host time."""

from infer_cluster.worker import LLM


def _flags(llm):
    return [m.use_gemm for m in llm.engine.runner.model.modules() if hasattr(m, "use_gemm")]


def test_eager_engines_keep_cublas(checkpoints, monkeypatch):
    monkeypatch.delenv("INFER_CLUSTER_GEMM", raising=False)
    eager = _flags(LLM(checkpoints["qwen3"], device="cpu", enforce_eager=True, warmup=False))
    graphs = _flags(LLM(checkpoints["qwen3"], device="cpu", enforce_eager=False, warmup=False))
    # qkv, o, gate_up and down of each layer (Qwen3's linears have no bias)
    assert len(eager) == len(graphs) >= 4
    assert not any(eager) and all(graphs)
    monkeypatch.setenv("INFER_CLUSTER_GEMM", "0")
    assert not any(_flags(LLM(checkpoints["qwen3"], device="cpu", warmup=False)))
