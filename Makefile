# Every target creates what it needs: the virtualenv, the requirements, the services.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
KAFKA_BROKERS ?= 1
export KAFKA_BROKERS

.PHONY: venv services-up services-down services-status run test lint format requirements spark-jars bench-analytics

$(VENV)/.installed: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; the project needs Python 3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --requirement requirements.txt
	@touch $@

venv: $(VENV)/.installed

services-up:
	@scripts/services.sh up

services-down:
	@scripts/services.sh down

services-status:
	@scripts/services.sh status

run: venv spark-jars
	@scripts/run.sh

test: venv services-up spark-jars
	$(BIN)/pytest $(PYTEST_ARGS)

# The PostgreSQL JDBC driver and spark-sql-kafka for the analytics job, into .local/spark-jars.
spark-jars:
	@scripts/spark-jars.sh

# Generates 1M events in the database outbox_bench and times the analytics job on them.
BENCH_EVENTS ?= 1000000
bench-analytics: venv services-up spark-jars
	DATABASE_URL=postgres://outbox:outbox@127.0.0.1:5432/outbox_bench \
	  $(BIN)/python manage.py analytics_bench --events $(BENCH_EVENTS)

# One inbox consumer process: 100k events of 1 KB on 6 partitions, rates on new events, on
# duplicates and of a naive per-message-commit consumer. BENCH_INBOX_ARGS="--events 20000".
.PHONY: bench-inbox
bench-inbox: venv services-up
	$(BIN)/python benchmarks/inbox_bench.py $(BENCH_INBOX_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Re-pins requirements.txt from the top-level packages in requirements.in.
requirements:
	rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin
	.venv-pin/bin/pip install --quiet --requirement requirements.in
	{ echo "# Every package pinned with ==. Top-level packages: requirements.in; 'make requirements' re-pins."; \
	  .venv-pin/bin/pip freeze | sort; } > requirements.txt
	rm -rf .venv-pin
