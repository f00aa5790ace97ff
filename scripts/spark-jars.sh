#!/usr/bin/env bash
# Fetches the jars the analytics job hands to Spark (PostgreSQL JDBC driver, spark-sql-kafka
# and its runtime dependencies) from Maven Central into SPARK_JARS_DIR. Idempotent: does
# nothing while the folder holds the jars of the current scripts/spark/pom.xml.
set -euo pipefail

PROJECT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$PROJECT_DIR/scripts/spark/pom.xml"
MAVEN_SETTINGS="$PROJECT_DIR/scripts/spark/settings.xml"
JARS_DIR="${SPARK_JARS_DIR:-$PROJECT_DIR/.local/spark-jars}"
STAMP="$JARS_DIR/.pom.sha256"

die() { echo "spark-jars: $*" >&2; exit 1; }

wanted="$(sha256sum "$POM" "$MAVEN_SETTINGS" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$wanted" ]] \
  && compgen -G "$JARS_DIR/postgresql-*.jar" >/dev/null \
  && compgen -G "$JARS_DIR/spark-sql-kafka-0-10_*.jar" >/dev/null; then
  exit 0
fi

command -v mvn >/dev/null || die "mvn not found: the Spark jars are fetched from Maven Central with Maven (Debian: apt-get install maven)"
echo "spark-jars: fetching the PostgreSQL JDBC driver and spark-sql-kafka into $JARS_DIR"
rm -rf "$JARS_DIR.tmp"
mvn -q -B -s "$MAVEN_SETTINGS" -f "$POM" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$JARS_DIR.tmp" >/dev/null \
  || die "mvn could not fetch the jars (see 'mvn -s scripts/spark/settings.xml -f scripts/spark/pom.xml dependency:copy-dependencies')"
echo "$wanted" > "$JARS_DIR.tmp/.pom.sha256"
rm -rf "$JARS_DIR"
mv "$JARS_DIR.tmp" "$JARS_DIR"
ls "$JARS_DIR"
