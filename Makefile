# Every target creates what it needs: the virtualenv, the requirements, the services.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
KAFKA_BROKERS ?= 1
export KAFKA_BROKERS

.PHONY: venv services-up services-down services-status run test lint format requirements

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

run: venv
	@scripts/run.sh

test: venv services-up
	$(BIN)/pytest $(PYTEST_ARGS)

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
