# The two commands a new user needs: `make demo` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all demo bench compile clean

$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh
	./scripts/install-system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip setuptools wheel
	# constraints.txt pins every transitive version we tested with (torch==2.13.0 CPU build among them).
	$(PY) -m pip install -q -c constraints.txt -e '.[openenv,trl]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

demo: $(STAMP)
	$(PY) -m pipelines.cli demo

bench: $(STAMP)
	$(PY) -m sandbox_service.bench

compile: $(STAMP)
	$(PY) -m pipelines.cli compile --out build/pipelines

clean:
	rm -rf build .pytest_cache
