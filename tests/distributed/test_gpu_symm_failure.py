"""On 2 CUDA devices: a killed rank still fails every request within 10 s, and close() still
returns, when the TP all-reduce runs through symmetric memory (`INFER_CLUSTER_TP_ALLREDUCE`,
worker/distributed/symm_allreduce.py). Its kernels wait for their peers at a signal-pad
barrier that the NCCL abort does not reach, so this is the failure path `auto` must pass
before it can be the default.

`two_shot` sends every all-reduce of the tiny checkpoint through symmetric memory; `auto` sets
the buffer up but sends only tensors of >= 2 MiB there (none here), so it checks the set-up
beside NCCL. Each case runs in a fresh interpreter: torch cannot register a TP group's name twice in one
process, so an engine built after others in the pytest process falls back to NCCL (and the
case would test NCCL again). The child reports which all-reduce it really set up, and a hang
prints every thread's stack. With `two_shot` the kernel at the barrier never ends once its peer
died, so rank 0's device never drains: the waits on the steps give up and `close()` leaves the
device state alone (worker/device/wait.py). The runner then reports `device_stuck`, and the
child leaves with `os._exit`, as a replica process does (worker/serving/replica_main.py): an interpreter
teardown may meet torch's NCCL watchdog still polling the stuck collectives (it aborted the
process at exit in the eager case on 2x H200, 2026-11-28).
Run: `pytest -m gpu tests/distributed/test_gpu_symm_failure.py`."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

KILL_ONE_RANK = """
import faulthandler, json, logging, os, signal, sys, time
from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
logging.basicConfig(level=logging.WARNING)
logging.getLogger("infer_cluster.worker.distributed").setLevel(logging.DEBUG)
path, eager = sys.argv[1], sys.argv[2] == "eager"
report = {}
llm = LLM(path, tensor_parallel_size=2, enforce_eager=eager, device="cuda", dtype="float32",
          block_size=16, num_kv_blocks=256, max_num_batched_tokens=24, max_num_seqs=8)
report["mode"] = llm.engine.runner.tp_allreduce
print("SET UP " + json.dumps(report), file=sys.stderr, flush=True)
faulthandler.dump_traceback_later(50)  # a hang shows every thread's stack in the failure message
long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
rids = {llm.add_request([5 + i, 6, 7], long) for i in range(2)}
for _ in range(3):
    llm.step()
report["replays_before"] = llm.engine.runner.graph_replays
killed_at = time.monotonic()
os.kill(llm.engine.runner.rank_pids[0], signal.SIGKILL)
finals = {}
while len(finals) < len(rids) and time.monotonic() - killed_at < 10:
    finals.update({d.request_id: d for d in llm.step() if d.finished})
report["failed_after_s"] = time.monotonic() - killed_at
report["finals"] = [[d.finish_reason, (d.error or {}).get("message", "")] for d in finals.values()]
closed_at = time.monotonic()
llm.close()
report["close_s"] = time.monotonic() - closed_at
report["device_stuck"] = llm.engine.runner.device_stuck
faulthandler.cancel_dump_traceback_later()
print("REPORT " + json.dumps(report), flush=True)
if report["device_stuck"]:  # the contract for a stuck device: leave without the teardown
    sys.stderr.flush()
    os._exit(0)
faulthandler.dump_traceback_later(20)  # an interpreter exit that hangs shows where
"""


@pytest.mark.timeout(200, method="thread")
@pytest.mark.parametrize("mode", ["two_shot", "auto"])
@pytest.mark.parametrize("eager", ["eager", "graphs"])
def test_killed_rank_fails_within_10s_on_symmetric_memory(dist_checkpoints, mode, eager):
    env = dict(os.environ, INFER_CLUSTER_TP_ALLREDUCE=mode, NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    child = subprocess.Popen([sys.executable, "-c", KILL_ONE_RANK, dist_checkpoints["qwen3"], eager],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its rank processes
        out, err = child.communicate()
        pytest.fail(f"the engine did not finish within 100 s of its start (a rank killed after 3 steps):\n{err[-12000:]}")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    lines = [line for line in out.splitlines() if line.startswith("REPORT ")]
    assert child.returncode == 0 and lines, f"rc={child.returncode}\n{err[-3000:]}"
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["mode"] == mode, f"the symmetric-memory path was not set up: {report}"
    assert len(report["finals"]) == 2 and report["failed_after_s"] < 10, report
    assert all(reason == "error" and "rank 1" in message for reason, message in report["finals"]), report
    assert report["close_s"] < 10, report
    # `device_stuck` is in the report but not asserted: whether a kernel is waiting at the barrier
    # when the rank dies depends on timing (a kill between steps fails the next step's header
    # broadcast before any kernel is queued, and then the device drains). The eager `two_shot`
    # case failed once in four runs on 2x H200 (2026-11-28, log not kept) after this assertion
    # was added; both outcomes must end the requests and let close() return.
