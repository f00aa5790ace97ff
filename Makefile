# Every target creates what it needs: the virtualenv, the requirements, the services.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: scenarios scenarios-down results browser-deps bench-console venv services-up services-down services-status run test lint format requirements spark-jars bench-analytics

$(VENV)/.installed: requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; the project needs Python 3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --requirement requirements.txt
	@touch $@

venv: $(VENV)/.installed

# TRACING=1 (in the environment or on make's command line) starts Zipkin as well.
services-up:
	@scripts/services.sh up

services-down:
	@scripts/services.sh down

services-status:
	@scripts/services.sh status

# `make run TRACING=1`: Zipkin too, and every process exports its spans to it.
run: venv spark-jars
	@scripts/run.sh

# browser-deps has installed Chromium: the browser test must run, not be skipped. The services
# with Zipkin: tests read the traces the processes they start export.
test: venv spark-jars browser-deps
	@TRACING=1 scripts/services.sh up
	E2E_BROWSER_REQUIRED=1 TRACING_BACKEND_REQUIRED=1 $(BIN)/pytest $(PYTEST_ARGS)

# The PostgreSQL JDBC driver and spark-sql-kafka for the analytics job, into .local/spark-jars.
spark-jars:
	@scripts/spark-jars.sh

# Generates 1M events in the database <dev db>_analytics_bench (created if missing) and times
# the analytics job on them.
BENCH_EVENTS ?= 1000000
bench-analytics: venv services-up spark-jars
	$(BIN)/python benchmarks/analytics_bench.py --events $(BENCH_EVENTS)

# Outbox (about 37 minutes): raw producer and relay rates, the relay through Kafka's SASL_SSL
# listener against PLAINTEXT (issue 43's 0.8x), publish lag under load, then the
# targets of issue 22: key skew, a held snapshot, WAL per event, one key; then issue 42's: the
# relay beside a writer idle in its transaction (20 of the minutes; PASS/FAIL per target, exit
# code 1 when one is missed). In the database <dev db>_bench, recreated each run.
# BENCH_OUTBOX_ARGS="--only skew --only wal" runs parts; `benchmarks/outbox_bench.py --help`
# gives the size options for a short run.
# "--tracing" adds to the rates the relay with tracing off and on (events/s, CPU µs/event,
# their ratios); BENCH_OUTBOX_ARGS="--only rates --tracing" runs only those rates.
.PHONY: bench-outbox
bench-outbox: venv services-up
	$(BIN)/python benchmarks/outbox_bench.py $(BENCH_OUTBOX_ARGS)

# One inbox consumer process: 100k events of 1 KB on 6 partitions, rates on new events, on
# duplicates and of a naive per-message-commit consumer, then order per key and one held key.
# BENCH_INBOX_ARGS="--only rates --events 20000" runs a part; "--tracing" adds the consumer
# with tracing off and on (events/s, CPU µs/event, their ratios, the process spans exported).
.PHONY: bench-inbox
bench-inbox: venv services-up
	$(BIN)/python benchmarks/inbox_bench.py $(BENCH_INBOX_ARGS)

# Not part of CI: the whole pipeline for 30 minutes at 1,000 events/s (writers, relay,
# consumers, retention every minute, the console polled), one row a minute, then a summary and
# its checks (exit code 1 when one fails); in the database <dev db>_soak, recreated each run.
# SOAK_ARGS="--minutes 3" for a short run; `benchmarks/soak.py --help` gives the options.
.PHONY: soak
soak: venv services-up
	$(BIN)/python benchmarks/soak.py $(SOAK_ARGS)

# Debian's chromium and chromium-driver for the console's browser test (never a downloaded
# browser). Needs root or sudo the first time; a no-op once they are installed.
browser-deps:
	@test -x /usr/bin/chromedriver && command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; }

# 1M outbox and 1M inbox rows and their 3M attempt rows in the database <dev db>_console_bench,
# then p50/p95 of the admin and API lists, details, attempts and the dashboard, and two
# 100,000-row failure-group retries. BENCH_CONSOLE_ARGS="--rows 100000 --runs 50" to vary.
bench-console: venv services-up
	$(BIN)/python benchmarks/console_bench.py $(BENCH_CONSOLE_ARGS)

# The fault-injection scenarios at full size (100,000 events; 20,000 for the fault-heavy ones)
# on their own isolated 3-broker cluster, then a table. SCENARIO_ARGS="relay-kill --events 5000".
# They stop the isolated services they started when they end (SCENARIO_ARGS="--keep-services"
# leaves them up); `make scenarios-down` stops them.
scenarios: venv
	$(BIN)/python manage.py scenario_run $(SCENARIO_ARGS)

scenarios-down: venv
	$(BIN)/python manage.py scenario_services down

# Runs the outbox, inbox and analytics benchmarks and the full scenario suite and writes
# docs/RESULTS.md. RESULTS_ARGS="--scenario-events 5000" for a quicker page.
results: venv services-up spark-jars
	$(BIN)/python manage.py results_report $(RESULTS_ARGS)

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
