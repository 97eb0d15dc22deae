"""On 2+ CUDA devices (NCCL): tensor / pipeline parallel greedy output equals T=1 on the same
GPU type for the tiny float32 checkpoints (T=1 on GPU vs HF is tests/parity/test_gpu.py), with
and without decode CUDA graphs (every TP rank captures the same ladder in lock step, one per
pipeline stage at P > 1, and decode steps must really replay); a killed rank fails the replica
within 10 s in eager and graph mode (the NCCL abort path, which must not wait for the captured
graphs), and close() ends every rank after graphs were captured. P = 2 with stage graphs also
matches with micro-batches, synchronous and with async scheduling (a group's next step
launched before its draw reaches the host).
T=4 and T=2 x P=2 need 4 devices.
Run: `pytest -m gpu tests/distributed`."""

import os
import signal
import time

import pytest
import torch

from infer_cluster.worker import LLM

from .conftest import GREEDY, check_parallel_greedy, make_prompts

pytestmark = pytest.mark.gpu
NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
if NUM_GPUS < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

GPU = dict(device="cuda", dtype="float32", block_size=16, num_kv_blocks=256,
           max_num_batched_tokens=24, max_num_seqs=8)
LAYOUTS = {"tp2_eager": (2, 1, True), "tp2_graphs": (2, 1, False), "pp2": (1, 2, True),
           "pp2_graphs": (1, 2, False), "tp2_pp2": (2, 2, True), "tp2_pp2_graphs": (2, 2, False),
           "tp4_graphs": (4, 1, False)}


@pytest.fixture(scope="module")
def gpu_single(dist_checkpoints):
    """family -> T=1 greedy tokens on cuda:0."""
    ref = {}
    for family in ("qwen2", "qwen3"):
        with LLM(dist_checkpoints[family], enforce_eager=True, **GPU) as llm:
            ref[family] = [o.token_ids for o in llm.generate(make_prompts(), GREEDY, use_tqdm=False)]
    return ref


@pytest.mark.timeout(180, method="thread")  # a hung NCCL call never returns to a signal handler
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gpu_parallel_greedy_matches(started, dist_checkpoints, gpu_single, family, layout):
    tp, pp, eager = LAYOUTS[layout]
    if tp * pp > NUM_GPUS:
        pytest.skip(f"needs {tp * pp} CUDA devices, {NUM_GPUS} visible")
    llm = check_parallel_greedy(started, dist_checkpoints[family], tp, pp, dict(GPU, enforce_eager=eager),
                                [gpu_single[family]])
    replays = llm.engine.runner.graph_replays
    if eager:
        assert replays == 0
    else:  # pure decode steps (<= 8 sequences) replay a graph on every rank (every stage)
        assert replays > 0


@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
@pytest.mark.parametrize("tp,pp,victim", [(2, 1, 1), (2, 2, 2)], ids=["tp2", "tp2_pp2"])
def test_gpu_killed_rank_fails_within_10s(started, dist_checkpoints, eager, tp, pp, victim):
    """T=2: rank 1 dies; T=2 x P=2: rank 2 (stage 1's TP leader, which sends the logits back)."""
    from infer_cluster.protocol import SamplingParams

    if tp * pp > NUM_GPUS:
        pytest.skip(f"needs {tp * pp} CUDA devices, {NUM_GPUS} visible")
    llm = started.track(LLM(dist_checkpoints["qwen3"], tensor_parallel_size=tp,
                            pipeline_parallel_size=pp, enforce_eager=eager, **GPU))
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    rids = {llm.add_request([5 + i, 6, 7], long) for i in range(2)}
    for _ in range(3):
        llm.step()
    killed_at = time.monotonic()
    os.kill(llm.engine.runner.rank_pids[victim - 1], signal.SIGKILL)
    finals = {}
    while len(finals) < len(rids):
        assert time.monotonic() - killed_at < 10, "requests still running 10 s after the kill"
        finals.update({d.request_id: d for d in llm.step() if d.finished})
    assert all(d.finish_reason == "error" and f"rank {victim}" in d.error["message"]
               for d in finals.values())
    if not eager:
        assert llm.engine.runner.graph_replays == 0  # released, so the NCCL abort could finish
    closed_at = time.monotonic()
    llm.close()
    assert time.monotonic() - closed_at < 10, "close() after the failure took too long"


@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("microbatches,async_", [("off", "auto"), ("on", False), ("on", "auto")])
def test_gpu_stage_graphs_greedy_matches(started, dist_checkpoints, gpu_single, monkeypatch, microbatches, async_):
    """At P = 2 each stage replays its own decode graphs (the activations and logits go between
    them outside the graphs), one step at a time and with micro-batches (async scheduling off,
    and on: a group's next step reads its ids from the queued draw on the device), and greedy
    tokens still equal T=1's."""
    monkeypatch.setenv("INFER_CLUSTER_STAGE_GRAPHS", "1")  # the default; the rank processes inherit it
    options = dict(GPU, enforce_eager=False, pipeline_microbatches=microbatches, async_scheduling=async_)
    llm = check_parallel_greedy(started, dist_checkpoints["qwen3"], 1, 2, options, [gpu_single["qwen3"]])
    assert llm.engine.runner.graph_replays > 0


@pytest.mark.timeout(400, method="thread")
def test_gpu_tp2_pp2_starts_and_stops_ten_times(started, dist_checkpoints, gpu_single):
    """T=2 x P=2 start-up once hung on four GPUs (NCCL subgroups split from a device-bound world,
    shard.py): ten start-ups and shutdowns in a row, each answering, none leaving a rank behind."""
    if NUM_GPUS < 4:
        pytest.skip(f"needs 4 CUDA devices, {NUM_GPUS} visible")
    from .conftest import wait_gone

    for attempt in range(10):
        t = time.monotonic()
        llm = LLM(dist_checkpoints["qwen3"], tensor_parallel_size=2, pipeline_parallel_size=2,
                  enforce_eager=attempt % 2 == 0, **GPU)
        started.track(llm)
        pids = list(llm.engine.runner.rank_pids)
        started.add_pids(pids)
        out = llm.generate(make_prompts()[:2], GREEDY, use_tqdm=False)
        assert [o.token_ids for o in out] == gpu_single["qwen3"][:2], f"attempt {attempt}"
        llm.close()
        assert wait_gone(pids, 10.0) == [], f"attempt {attempt}: ranks left after close()"
        assert time.monotonic() - t < 60, f"attempt {attempt} took {time.monotonic() - t:.0f} s"


@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_gpu_t2_speculation_equals_one_rank_without(started, dist_checkpoints, gpu_single, method, eager):
    """T = 2 on GPUs with speculative decoding: prompt lookup, and a draft model (the target's
    own weights) that runs whole on rank 0's device beside the rank group. Greedy output equals
    T = 1 without speculation; the same-weights draft has every proposal accepted."""
    from tests.distributed.test_spec_decode import PROMPTS, SPEC
    from infer_cluster.protocol import SamplingParams

    path = dist_checkpoints["qwen3"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with LLM(path, enforce_eager=True, **GPU) as single:
        want = [o.token_ids for o in single.generate(PROMPTS, params, use_tqdm=False)]
    spec = SPEC if method == "ngram" else {"method": "draft_model", "model": path,
                                           "num_speculative_tokens": 3, "adaptive": False}
    llm = started.track(LLM(path, tensor_parallel_size=2, speculative_config=spec, enforce_eager=eager, **GPU))
    got = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    stats = llm.stats()
    assert got == want
    assert stats["num_spec_accepted_tokens"] > 0
    if method == "draft_model":
        assert stats["num_spec_accepted_tokens"] == stats["num_spec_draft_tokens"]
