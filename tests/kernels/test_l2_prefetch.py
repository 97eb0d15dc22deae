"""The L2 weight prefetch (kernels/l2_prefetch*.py, worker/models/l2_prefetch.py).

Prefetching has no result to compare with a reference, so: the mode rule and the argument checks
run everywhere; without a GPU both modes are compiled for sm_90 ahead of time (in a subprocess:
the interpreter this test directory turns on cannot compile) and the assembly must hold the
prefetch instructions; on CUDA the kernel runs eagerly and inside a CUDA graph, leaves every
byte as it was, and `WeightPrefetcher` changes no output of a model forward.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from infer_cluster.kernels.l2_prefetch import l2_prefetch, l2_prefetch_mode

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_mode_is_off_off_cuda(monkeypatch):
    for asked in ("auto", "bulk", "lines", "off"):
        monkeypatch.setenv("INFER_CLUSTER_L2_PREFETCH", asked)
        assert l2_prefetch_mode(torch.device("cpu")) == "off"


def test_unknown_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_L2_PREFETCH", "sideways")
    with pytest.raises(ValueError, match="INFER_CLUSTER_L2_PREFETCH must be one of auto, off, bulk, lines"):
        l2_prefetch_mode(torch.device("cpu"))


def test_rejects_bad_arguments():
    dummy = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(ValueError, match="mode must be one of bulk, lines"):
        l2_prefetch([torch.zeros(8)], dummy, "off")
    with pytest.raises(ValueError, match="contiguous, 16-byte aligned CUDA tensors"):
        l2_prefetch([torch.zeros(8)], dummy, "bulk")  # a CPU tensor


_AOT = textwrap.dedent("""
    import inspect, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from infer_cluster.kernels.l2_prefetch_triton import CHUNK, LANES, LINE, _l2_prefetch_kernel
    names = list(inspect.signature(_l2_prefetch_kernel.fn).parameters)
    consts = dict(BULK=sys.argv[1] == "bulk", LANES=LANES, CHUNK=CHUNK, LINE=LINE)
    sig, values, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in consts:
            sig[name], values[(i,)] = "constexpr", consts[name]
        else:  # addresses as the JIT types them (> 2**31), sizes and the flag as int32
            sig[name] = "*i32" if name == "dummy_ptr" else ("i64" if name[0] == "a" else "i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(_l2_prefetch_kernel, sig, values, attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
    assert k.asm["cubin"], "no cubin"
    print(k.asm["ptx"])
""")


@pytest.mark.parametrize("mode,instruction", [("bulk", "cp.async.bulk.prefetch.L2.global"),
                                              ("lines", "prefetch.global.L2::evict_last")])
def test_compiles_for_sm90(mode, instruction):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _AOT, mode], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert instruction in done.stdout
    if mode == "bulk":
        assert done.stdout.count(instruction) == 1  # one request per lane, no per-line loop


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mode", ["bulk", "lines"])
def test_prefetch_runs_eagerly_and_in_a_graph_and_changes_nothing(mode):
    if mode == "bulk" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("bulk prefetch needs sm_90")
    g = torch.Generator(device="cuda").manual_seed(0)
    ts = [torch.randn(n, device="cuda", generator=g, dtype=torch.bfloat16)
          for n in (8, 4096 * 1024, 3 * 1024 * 1024 + 8, 5 * 16384 + 24)]  # 4+ ranges: two launches
    ts.append(torch.randint(0, 100, (1000,), device="cuda", dtype=torch.int32).add_(1)[:992])
    before = [t.clone() for t in ts]
    dummy = torch.full((32,), 7, dtype=torch.int32, device="cuda")
    l2_prefetch(ts, dummy, mode)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.graph(graph):
        ev = torch.cuda.Event()
        ev.record()
        side.wait_event(ev)
        with torch.cuda.stream(side):
            l2_prefetch(ts, dummy, mode)
        done = torch.cuda.Event()
        done.record(side)
        torch.cuda.current_stream().wait_event(done)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for t, b in zip(ts, before):
        assert torch.equal(t, b)
    assert torch.equal(dummy, torch.full_like(dummy, 7))


@pytest.mark.gpu
@cuda
def test_weight_prefetcher_changes_no_forward_output(monkeypatch):
    """Eager and captured forwards of a small bf16 model give bit-identical logits with the
    prefetcher on (both modes) and off."""
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the default mode needs sm_90")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    prompts = [list(range(5, 40)), list(range(100, 117)), list(range(7, 90))]
    results = {}
    for mode in ("off", "bulk", "lines"):
        for eager in (True, False):
            monkeypatch.setenv("INFER_CLUSTER_L2_PREFETCH", mode)
            llm = LLM("tiny-random", device="cuda", dtype="bfloat16", num_kv_blocks=256,
                      max_num_seqs=8, enforce_eager=eager)
            pf = llm.engine.runner.model.prefetcher
            assert (pf is None) == (mode == "off") and (pf is None or pf.mode == mode)
            outs = llm.generate(prompts, params, use_tqdm=False)
            results[mode, eager] = [(o.token_ids, o.logprobs) for o in outs]
            llm.close()
    for key, got in results.items():
        assert got == results["off", key[1]], key
