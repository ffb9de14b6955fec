# The README's two commands: `make main` (set-up + main job) and `make test` (set-up + tests).
# Set-up creates .venv and installs the pinned dependencies (torch installs from the local disk here).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup main test test-all test-fast lint zoo

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -c requirements.lock -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

main: $(STAMP)
	$(VENV)/bin/python -m lab arrows
	$(VENV)/bin/python -m lab report

zoo: $(STAMP)
	$(VENV)/bin/python -m lab zoo

# one torch thread per test process: two xdist workers (and the processes they start) on two cores, without
# OpenMP threads spinning against each other
TEST_ENV := OMP_NUM_THREADS=1

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests -n 2 --dist worksteal -m "not extended"

# every test, the `extended` ones too (timm's and transformers' suites on the second half of the encoding classes,
# inductor on one encoding of each mechanism: what a cold compile cache makes slow on a fresh CI machine)
test-all: $(STAMP)
	$(VENV)/bin/ruff check .
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests -n 2 --dist worksteal

# the quick tier while working: everything but the slow, host-suite and export tests (CI runs `make test`)
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests -n 2 --dist worksteal -m "not slow and not hosts and not export and not extended"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
