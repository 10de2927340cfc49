# Two commands for a newcomer: `make plan` (install + plan on the built-in defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRAINERS_STAMP := $(VENV)/.trainers
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

# The main job's defaults: Llama-3 70B on 1024 H100s, 1024 sequences of 8192 tokens per step.
MODEL ?= llama3-70b
GPU ?= h100-sxm
GPUS ?= 1024
GLOBAL_BATCH ?= 1024
SEQ_LEN ?= 8192

.PHONY: install trainers plan test bench accuracy vocab-report clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[dev]'
	touch $(STAMP)

# The trainers' own validation code, CPU only, for the emitter contract tests (../shared/TRAINERS.md):
# the local CPU build of torch first, then every trainer package with --no-deps so no CUDA build is pulled.
trainers: $(TRAINERS_STAMP)

$(TRAINERS_STAMP): $(STAMP) requirements-trainers.txt
	echo "torch==2.13.0" > $(VENV)/constraints.txt
	$(PIP) torch==2.13.0
	$(PIP) -c $(VENV)/constraints.txt -r requirements-trainers.txt
	$(PIP) --no-deps megatron-core==0.16.1 torchtitan==0.3.0 spmd_types==0.2.3 triton torchao==0.18.0
	$(PIP) --no-deps --target $(VENV)/torchtitan-0.2.2 torchtitan==0.2.2
	$(PY) -m pip download --quiet --disable-pip-version-check --no-deps deepspeed==0.19.8 -d $(VENV)/downloads
	DS_BUILD_OPS=0 $(PIP) --no-deps --no-build-isolation $(VENV)/downloads/deepspeed-0.19.8.tar.gz
	touch $(TRAINERS_STAMP)

plan: install
	$(VENV)/bin/autotune plan --model $(MODEL) --gpu $(GPU) --gpus $(GPUS) --global-batch $(GLOBAL_BATCH) \
		--seq-len $(SEQ_LEN)

# Two pytest-xdist workers: the suite is CPU-bound (CP-SAT solves, brute-force enumerations, CPU training runs).
# Each test file stays on one worker (loadfile): the fuzz module counts its cases across its tests.
# The checks marked slow (the largest brute-force optimality enumerations, CPU training, profiling and
# calibration runs) run where CI is set (CI runs `make test` with CI=true) or with SLOW=1; without, the rest.
TEST_WORKERS ?= 2
SLOW_TESTS := $(if $(CI)$(SLOW),,-m "not slow")
test: install trainers
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(SLOW_TESTS)

bench: install
	$(PY) -m autotune.reports.bench

# The cost model against every public set of published step times, each row's published configuration pinned:
# Megatron-LM 2021 Table 1 (A100) and profiles/published/published-runs-public.csv (H100/H200: NVIDIA
# dgxc-benchmarking, torchtitan, Megatron-LM examples). SET=megatron2021|public|all; JSON=1 for one JSON object.
SET ?= all
accuracy: install
	$(PY) -m autotune.reports.accuracy --set $(SET) $(if $(JSON),--json)

# Paper 4: vocabulary placement (ends / balanced / parallel) vs vocabulary size on a ~4B model, pp 8.
vocab-report: install
	$(PY) -m autotune.reports.vocab

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
