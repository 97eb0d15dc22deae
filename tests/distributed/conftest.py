"""Shared pieces of the tensor/pipeline-parallel tests: tiny checkpoints of each family (the
parity suite's specs), short prompts, HF greedy references, and process bookkeeping that
makes sure no rank process outlives its test."""

import os
import signal
import time

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from tests.parity.conftest import FAMILIES
from infer_cluster.worker.loading.embedded import build_checkpoint

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
# Small blocks and a small token budget so prompts are prefilled in chunks (steps that sample
# nothing) and later prompts reuse cached prefix blocks.
ENGINE = dict(block_size=8, num_kv_blocks=96, max_num_batched_tokens=24)


def make_prompts() -> list[list[int]]:
    base = [(7 * i + 3) % 500 + 2 for i in range(40)]
    return [[5], [17, 33, 2, 480, 9, 71, 301], base[:23], base[:40]]


def check_parallel_greedy(started, path, tp, pp, options, references):
    """Greedy tokens of a T x P replica equal every list in `references` (T=1, HF); a second
    round of the long prompts hits the prefix cache on every rank and gives the same tokens."""
    from infer_cluster.worker import LLM

    prompts = make_prompts()
    llm = started.track(LLM(path, tensor_parallel_size=tp, pipeline_parallel_size=pp, **options))
    assert len(llm.engine.runner.rank_pids) == tp * pp - 1
    tokens = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    for i, ref in enumerate(references):
        assert tokens == ref, f"T={tp} P={pp} differs from reference {i}"
    again = llm.generate(prompts[2:], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in again] == tokens[2:]
    assert all(o.num_cached_tokens >= 16 for o in again)
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    runner = llm.engine.runner
    # T > 1, P = 1 shards its logits: the greedy steps gathered argmax pairs, not logits
    split = tp > 1 and pp == 1 and os.environ.get("INFER_CLUSTER_TP_GREEDY_IDS", "1") != "0"
    assert runner.takes_greedy_ids == split
    assert (runner.greedy_id_steps > 0) == split
    return llm


@pytest.fixture(scope="session")
def dist_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist_checkpoints")
    return {name: str(build_checkpoint(root / name, spec, seed=1234)) for name, spec in FAMILIES.items()}


@pytest.fixture(scope="session")
def hf_greedy(dist_checkpoints):
    """family -> HF transformers greedy tokens for each prompt (each alone, float32)."""
    from transformers import AutoModelForCausalLM

    ref = {}
    for family, path in dist_checkpoints.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        rows = []
        for p in make_prompts():
            with torch.no_grad():
                g = model.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                   eos_token_id=None, pad_token_id=1)
            rows.append(g[0, len(p):].tolist())
        ref[family] = rows
    return ref


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an exited child awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait until none of `pids` runs; return those still running after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if is_running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def kill_pids(pids) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def started():
    """Collects LLMs and pids a test starts; closes / kills them whatever the outcome, and
    fails the test if a rank process is still running after close()."""
    llms, pids = [], []

    class Tracker:
        def track(self, llm):
            """Track an `LLM` or a `DynamicEngine`."""
            llms.append(llm)
            pids.extend(getattr(llm, "engine", llm).runner.rank_pids)
            return llm

        def add_pids(self, more):
            pids.extend(more)

    yield Tracker()
    for llm in llms:
        llm.close()
    orphans = wait_gone(pids, 5.0)
    kill_pids(orphans)
    assert not orphans, f"rank processes still running after close(): {orphans}"
