# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv with what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/benchbot demo --out demo-output

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check bot workers tests bench tools ops
	$(BIN)/ruff format --check bot workers tests bench tools ops
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/sim_capacity.py
	$(BIN)/python bench/client_accuracy.py

clean:
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
