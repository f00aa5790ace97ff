# One image for the web server, the Celery worker and beat, the consumers and the demo.

# The analytics job's jars (PostgreSQL JDBC driver, spark-sql-kafka) from Maven Central, fetched
# by the project's own script in a build stage, so that Maven stays out of the image.
FROM maven:3.9-eclipse-temurin-17 AS spark-jars
WORKDIR /src
COPY scripts/spark-jars.sh scripts/
COPY scripts/spark scripts/spark
RUN SPARK_JARS_DIR=/opt/spark-jars scripts/spark-jars.sh

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPARK_JARS_DIR=/opt/spark-jars

# Java 17 runs the PySpark analytics job; curl and procps (pgrep) serve the health checks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless curl procps \
    && rm -rf /var/lib/apt/lists/*

COPY --from=spark-jars /opt/spark-jars /opt/spark-jars
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir --requirement requirements.txt

COPY . .
# With the production settings, so that whitenoise's manifest (staticfiles.json) is written:
# the production storage refuses to serve a file the manifest does not name. The values
# below only let the settings load; nothing connects at build time.
RUN DJANGO_SETTINGS_MODULE=project.settings.production SECRET_KEY=collectstatic-only \
    DATABASE_URL=postgres://build@localhost/build KAFKA_BOOTSTRAP_SERVERS=localhost:9092 \
    ALLOWED_HOSTS=localhost python manage.py collectstatic --noinput

# /var/lib/metrics: the Prometheus counters of every app container (a shared volume in
# docker-compose.yml); created here so that the volume belongs to the app user.
RUN useradd --system --uid 1000 app && chown -R app /app \
    && mkdir -p /var/lib/metrics && chown app /var/lib/metrics
USER app

EXPOSE 8000
CMD ["gunicorn", "project.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
