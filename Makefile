# Dev/CI entry points. `make test` is the README's test command.
# If no suitable environment is active, a pinned .venv is created first.
PYTHON ?= python3
VENV ?= .venv
# torch and triton are pinned exactly: an unpinned torch pulls a multi-GB CUDA build.
PINS = torch==2.13.0 triton==3.7.1 numpy

.PHONY: venv test test-fast serve bench clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(PINS)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

test: $(VENV)/.installed
	TRITON_INTERPRET=1 $(VENV)/bin/python -m pytest -q -x --timeout=600 tests

serve: $(VENV)/.installed
	$(VENV)/bin/infer-cluster serve

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
