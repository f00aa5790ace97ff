# One image for the web server, the Celery worker and beat, and the consumers.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Java 17 runs the PySpark analytics job; libpq for psql in the health checks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless postgresql-client curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir --requirement requirements.txt

COPY . .
RUN DJANGO_SETTINGS_MODULE=project.settings.local python manage.py collectstatic --noinput

# /var/lib/metrics: the Prometheus counters of every app container (a shared volume in
# docker-compose.yml); created here so that the volume belongs to the app user.
RUN useradd --system --uid 1000 app && chown -R app /app \
    && mkdir -p /var/lib/metrics && chown app /var/lib/metrics
USER app

EXPOSE 8000
CMD ["gunicorn", "project.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
