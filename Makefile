# flywheel — `make demo` and `make test` each do their own set-up on a fresh machine.
# TORCH selects the torch spec; the default is the CPU build that lies on this machine's disk.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo lint test test-fast bench clean

# What the job needs: torch and the package (the demo installs only this, ~1 minute less than the test set).
$(RUNTIME): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	@command -v bwrap >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || \
		echo "note: bubblewrap not installed; sandboxes fall back to 'local'")
	touch $(RUNTIME)

# The tests add pytest, hypothesis, Ray, Playwright and the other extras of `dev`, and Debian's chromium for the
# dashboard's browser tests (Playwright drives that binary; it never downloads a browser).
$(STAMP): $(RUNTIME)
	$(PY) -m pip install -q -e ".[dev]"
	@command -v chromium >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "note: chromium not installed; the dashboard's browser tests (-m browser) need it: apt-get install chromium")
	touch $(STAMP)

setup: $(STAMP)

demo: $(RUNTIME)
	$(VENV)/bin/flywheel demo

lint: $(STAMP)
	$(PY) -m ruff check src tests

test: $(STAMP) lint
	$(PY) -m pytest -q -m "not gpu" --durations=25 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu and not ray" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
