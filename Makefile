# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m tracewire demo

test: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy
	# The real-engine lane's llama-server and model: built/fetched once per machine, here
	# (visibly, a few minutes the first time) rather than inside a test.
	$(PY) -m tracewire engine llamacpp --prepare
	$(PY) -m pytest

# The quick lane (see CONTRIBUTING.md): no browser, Ray, real model, sandbox or agent CLI,
# and none of the slow sweeps; lanes are given by path in tests/conftest.py.
FAST := not (slow or browser or ray or realmodel or sandbox or agent)
test-fast: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy
	$(PY) -m pytest -q -m "$(FAST)"

lint: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy

bench: $(STAMP)
	for b in bench/[!_]*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
