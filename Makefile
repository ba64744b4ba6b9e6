# featurelake: every target sets up .venv itself, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOME_DIR ?= $(CURDIR)/.featurelake
export FEATURELAKE_HOME ?= $(HOME_DIR)
export DAGSTER_HOME ?= $(FEATURELAKE_HOME)/dagster

.PHONY: setup demo test test-torch ui bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/featurelake --home "$(FEATURELAKE_HOME)" demo

# DuckDB 1.5.5 + its Iceberg extension (the interop tests' independent reader) cannot share
# .venv with lake.sql's DuckDB 2: tests/interop.py keeps it in .venv-interop, installed once.
test: setup
	$(PY) tests/interop.py ensure
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The torch extra (several GB with CUDA) is installed only here; the torch tests skip without it.
test-torch: setup
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,torch]"
	$(PY) -m pytest -q -rs tests/test_torch.py

# tools/dagster_ui.py stops `dagster dev` and all its processes within seconds on Ctrl-C.
UI_ARGS ?=
ui: setup
	mkdir -p "$(DAGSTER_HOME)"
	exec $(PY) tools/dagster_ui.py -w workspace.yaml $(UI_ARGS)

bench: setup
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,bench]"
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .venv-interop .venv-interop.lock .featurelake .pytest_cache
