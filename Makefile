# mqd — make targets are the interface (see README.md)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python

.PHONY: install check-java test test-fast lint fmt demo bench chaos clean install-systemd

install: check-java $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

check-java:
	@$(PYTHON) scripts/check_java.py

test: install
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not spark and not slow"

lint: install
	$(BIN)/ruff check mqd tests bench
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff check --fix mqd tests bench
	$(BIN)/ruff format mqd tests bench

demo: install
	$(PY) -m mqd.demo

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

bench: install $(VENV)/.bench-installed
	$(PY) bench/bench.py

chaos: install
	$(PY) -m mqd.chaos --rounds 20

install-systemd:
	sh systemd/install.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
