# Two promises (see README): `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CLUSTER_DIR := data/cluster

.PHONY: install system-deps run test lint typecheck unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py storage/_framing.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: a local cluster of 3 controllers and 3 brokers, with a live status view
# until Ctrl-C (running it again resumes the same cluster).
run: install
	$(VENV)/bin/runnel cluster up --data-dir $(CLUSTER_DIR)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy storage raft runnel bench controller broker replication

# Debian's packages the tests use: kcat for the kcat compatibility tests and iproute2 (`ip`)
# for the network-partition tests (nodes in network namespaces, as root); each skips, saying
# why, without its package.
system-deps:
	@for want in kcat:kcat ip:iproute2; do \
		command -v $${want%%:*} >/dev/null && continue; \
		{ command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
			&& { apt-get install -y -qq $${want#*:} >/dev/null 2>&1 \
				|| { apt-get update -qq >/dev/null 2>&1 \
					&& apt-get install -y -qq $${want#*:} >/dev/null 2>&1; }; }; } \
		|| echo "$${want#*:} not installed (apt-get install $${want#*:}): its tests will skip"; \
	done

unit: install system-deps
	$(PY) -m pytest -n 2 -q

test: lint typecheck unit

bench: install
	$(PY) -m bench.storage
	$(PY) -m bench.raft
	$(PY) -m bench.metadata
	$(PY) -m bench.codec
	$(PY) -m bench.produce_consume
	$(PY) -m bench.idle_partitions
	$(PY) -m bench.isr_rejoin
	$(PY) -m bench.new_partition
	$(PY) -m bench.fetch_session_walk
	$(PY) -m bench.page_touch
	$(PY) -m bench.request_path

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache .hypothesis
