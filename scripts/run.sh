#!/usr/bin/env bash
# `make run`: services, migrations, an admin user, then the web server, a Celery worker,
# Celery beat and the consumers. Ctrl-C stops everything this script started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=.venv/bin
LOG_DIR=.local/logs
RUN_HOST="${RUN_HOST:-127.0.0.1}"
RUN_PORT="${RUN_PORT:-8000}"
ADMIN_USERNAME="${ADMIN_USERNAME:-admin}"
export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-project.settings.local}"
ZIPKIN_PORT="${ZIPKIN_PORT:-9411}"

# TRACING=1 (`make run TRACING=1`): services.sh starts Zipkin too, and every process below
# exports its spans to it, unless the OpenTelemetry variables already say otherwise.
tracing="${TRACING:-}"
if [[ "${tracing,,}" =~ ^(1|true|yes)$ ]]; then
  tracing=1
  export OTEL_TRACES_EXPORTER="${OTEL_TRACES_EXPORTER:-zipkin}"
  export OTEL_EXPORTER_ZIPKIN_ENDPOINT="${OTEL_EXPORTER_ZIPKIN_ENDPOINT:-http://127.0.0.1:$ZIPKIN_PORT/api/v2/spans}"
  # The console's event and message pages link to their trace in Zipkin's UI.
  export CONSOLE_TRACE_URL_TEMPLATE="${CONSOLE_TRACE_URL_TEMPLATE:-http://127.0.0.1:$ZIPKIN_PORT/zipkin/traces/{trace_id}}"
else
  tracing=""
fi

scripts/services.sh up
"$BIN/python" manage.py migrate --noinput

password_note="from ADMIN_PASSWORD"
if [[ -z "${ADMIN_PASSWORD:-}" ]]; then
  ADMIN_PASSWORD="$("$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(12))')"
  password_note="generated for this run"
fi
ADMIN_USERNAME="$ADMIN_USERNAME" ADMIN_PASSWORD="$ADMIN_PASSWORD" "$BIN/python" manage.py shell --verbosity 0 -c '
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username=os.environ["ADMIN_USERNAME"])
user.is_staff = user.is_superuser = True
user.set_password(os.environ["ADMIN_PASSWORD"])
user.save()
'

mkdir -p "$LOG_DIR"
# The Prometheus counters of every process started below, summed by the web's /metrics;
# its counter files are removed first, so that a run counts from zero.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$PWD/.local/metrics}"
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
rm -f "$PROMETHEUS_MULTIPROC_DIR"/*.db
pids=()
start() {
  local name="$1"; shift
  "$@" >"$LOG_DIR/$name.log" 2>&1 &
  pids+=("$!")
  printf '  %-22s pid %-7s log %s\n' "$name" "$!" "$LOG_DIR/$name.log"
}
stop_all() {
  trap - INT TERM EXIT
  echo; echo "stopping..."
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  echo "stopped (the services keep running; 'make services-down' stops them)"
}
trap 'stop_all; exit 130' INT TERM
trap stop_all EXIT

echo "starting:"
start web "$BIN/python" manage.py runserver --noreload "$RUN_HOST:$RUN_PORT"
start celery-worker "$BIN/celery" -A project worker --loglevel INFO --concurrency 2
start celery-beat "$BIN/celery" -A project beat --loglevel INFO
for group in $("$BIN/python" manage.py inbox_consume --list-groups 2>/dev/null || true); do
  start "consumer-$group" "$BIN/python" manage.py inbox_consume --group "$group"
done
demo_enabled="$("$BIN/python" manage.py shell --verbosity 0 -c 'from django.conf import settings; print(settings.DEMO_ENABLED)' 2>/dev/null || echo False)"
if [[ "$demo_enabled" == "True" ]]; then
  # Payments and deliveries (DEMO_RATE, DEMO_HANDLER_FAILURE_RATE, DEMO_DUPLICATE_RATE).
  start demo-traffic "$BIN/python" manage.py demo_traffic
fi

cat <<MSG

  Admin:    http://$RUN_HOST:$RUN_PORT/admin/   (the console's dashboard)
  API:      http://$RUN_HOST:$RUN_PORT/api/docs/   /metrics   /health/
  User:     $ADMIN_USERNAME
  Password: $ADMIN_PASSWORD ($password_note)${tracing:+
  Traces:   http://127.0.0.1:$ZIPKIN_PORT/zipkin/}

Press Ctrl-C to stop.
MSG
# Wait until Ctrl-C, or until one process dies; then stop the rest.
wait -n "${pids[@]}" || true
echo "a process exited; see $LOG_DIR"
stop_all
