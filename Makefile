# Two commands for a newcomer: `make plan` (install + plan on the built-in defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The main job's defaults: Llama-3 70B on 1024 H100s, 1024 sequences of 8192 tokens per step.
MODEL ?= llama3-70b
GPU ?= h100-sxm
GPUS ?= 1024
GLOBAL_BATCH ?= 1024
SEQ_LEN ?= 8192

.PHONY: install plan test bench accuracy clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

plan: install
	$(VENV)/bin/autotune plan --model $(MODEL) --gpu $(GPU) --gpus $(GPUS) --global-batch $(GLOBAL_BATCH) \
		--seq-len $(SEQ_LEN)

test: install
	$(PY) -m pytest

bench: install
	$(PY) -m autotune.bench

accuracy: install
	$(PY) -m autotune.accuracy

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
