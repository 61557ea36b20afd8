# atr-grpo: every target is one command that calls the package. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# Unsloth is installed without its dependencies on CPU machines: only its GRPO loss code is needed
# there (the CPU tests run our rule inside unsloth_zoo's compiled loss). GPU machines get the full extra.
UNSLOTH_PINS := unsloth==2026.10.7 unsloth_zoo==2026.10.7
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 && echo 1)

help: ## Show this menu
	@grep -E '^[a-zA-Z0-9_-]+:.*?## .*$$' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "\033[36m%-20s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@# torch first and exactly pinned, so that nothing resolves a multi-GB CUDA build on a CPU machine
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -r requirements.txt -e '.[dev]'
ifeq ($(HAS_GPU),1)
	$(PIP) install -q -e '.[dev,gpu]'
else
	$(PIP) install -q --no-deps $(UNSLOTH_PINS)
endif
	touch $@

install: $(STAMP) ## Create .venv and install the pinned stack (GPU extras too when nvidia-smi works)

lint: install ## ruff lint and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install ## Apply ruff's formatter and safe fixes
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint ## Lint, then the CPU test suite (GPU tests skip without CUDA)
	$(PY) -m pytest -q

clean: ## Remove caches (never touches results/runs)
	rm -rf .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +

.PHONY: help install lint format test clean
