from pathlib import Path

import pytest

from analytics.errors import SparkJarsMissing
from analytics.spark import spark_jars


def test_missing_jars_name_the_command_that_fetches_them(tmp_path: Path) -> None:
    (tmp_path / "postgresql-42.7.8.jar").write_bytes(b"")
    with pytest.raises(SparkJarsMissing, match="make spark-jars") as raised:
        spark_jars(jars_dir=tmp_path)
    assert "spark-sql-kafka-0-10_*.jar" in str(raised.value)


def test_the_jars_are_taken_from_the_folder(tmp_path: Path) -> None:
    names = [
        "kafka-clients-3.9.2.jar",
        "postgresql-42.7.8.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [jar.name for jar in spark_jars(jars_dir=tmp_path)] == names


def test_the_spark_session_reads_with_the_projects_jars(spark: object) -> None:
    jars = spark.sparkContext.getConf().get("spark.jars")  # type: ignore[attr-defined]
    assert "postgresql-" in jars
    assert "spark-sql-kafka-0-10_" in jars
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"  # type: ignore[attr-defined]
