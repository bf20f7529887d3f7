# Two promises (see README): `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_DIR := data/demo/events-0

.PHONY: install run test lint typecheck unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job until the cluster exists: write a partition log with the engine,
# verify it byte by byte, and dump its batches.
run: install
	rm -rf $(DEMO_DIR)
	seq 1 20000 | sed 's/^/event-/' | $(VENV)/bin/runnel log produce $(DEMO_DIR) --codec lz4 --batch-records 500 -q
	$(VENV)/bin/runnel log verify $(DEMO_DIR)
	$(VENV)/bin/runnel log dump $(DEMO_DIR) | tail -n 5

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy storage raft runnel bench controller broker

unit: install
	$(PY) -m pytest -n 2 -q

test: lint typecheck unit

bench: install
	$(PY) -m bench.storage
	$(PY) -m bench.raft

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache .hypothesis
