# Two entry points for a fresh machine: `make test` and `make study` (measures on this machine
# into experiments/local/<host>-<date>); `make reference` regenerates the committed reference.
# Each creates .venv if missing and installs what it needs from pyproject.toml first.
# GPU users pick their PyTorch build with TORCH_SPEC, e.g.
#   make study TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# The default is the CPU wheel so that no multi-GB CUDA build is pulled in by accident.

VENV ?= .venv
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.heptstudy-installed
STUDY_MATRIX ?= configs/study/cpu_default.yaml
# `make study` measures on this machine into its own folder: experiments/local/<host>-<date>,
# or STUDY_OUT. `make reference` regenerates the committed reference study experiments/REFERENCE.
STUDY_OUT ?=
REFERENCE ?= cpu_reference
STUDY_FLAGS ?=
DATA_DIR ?= data/tfds
# the package of this checkout, whichever checkout the environment was installed from
HEPTSTUDY := $(BIN)/python -m heptstudy
STUDY_EVENTS_TRAIN ?= 256
STUDY_EVENTS_TEST ?= 64

.PHONY: install test check-predictions study reference reference-b16 study-data lint format clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check heptstudy tests scripts experiments
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# Are the committed blind predictions of this code? Not part of `make test`: any model or step edit
# makes them stale until `ONLY=predictions bash scripts/regenerate_fits.sh` (7 to 10 minutes) is
# committed. scripts/gpu/run.sh refuses to measure until they are.
check-predictions: $(STAMP)
	$(BIN)/python scripts/gpu/check_predictions.py

study-data: $(STAMP)
	test -f $(DATA_DIR)/cld_edm_ttbar_hits/1/3.2.1/dataset_info.json || \
	  $(HEPTSTUDY) data generate --data-dir $(DATA_DIR) \
	    --events-train $(STUDY_EVENTS_TRAIN) --events-test $(STUDY_EVENTS_TEST) --seed 20261014

# Ends with the table of what was measured and where the report is.
study: study-data
	$(HEPTSTUDY) study run --matrix $(STUDY_MATRIX) --data-dir $(DATA_DIR) \
	  $(if $(STUDY_OUT),--out $(STUDY_OUT)) $(STUDY_FLAGS)

reference: study-data
	$(HEPTSTUDY) study run --matrix $(STUDY_MATRIX) --data-dir $(DATA_DIR) \
	  --reference $(REFERENCE) $(STUDY_FLAGS)

# batch 16 (one step of minutes) in a reference folder of its own
reference-b16:
	$(MAKE) reference STUDY_MATRIX=configs/study/cpu_b16.yaml REFERENCE=cpu_reference_b16

lint: $(STAMP)
	$(BIN)/ruff check heptstudy tests scripts experiments
	$(BIN)/ruff format --check heptstudy tests scripts experiments

format: $(STAMP)
	$(BIN)/ruff format heptstudy tests scripts experiments
	$(BIN)/ruff check --fix heptstudy tests scripts experiments

clean-venv:
	rm -rf $(VENV)
