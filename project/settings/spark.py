from project.settings.environment import BASE_DIR, env

SPARK_MASTER = env("SPARK_MASTER", default="local[*]")
SPARK_DRIVER_MEMORY = env("SPARK_DRIVER_MEMORY", default="2g")
SPARK_EXECUTOR_MEMORY = env("SPARK_EXECUTOR_MEMORY", default="2g")
# Jars (PostgreSQL JDBC driver, spark-sql-kafka) fetched by the project's set-up, never at run time.
SPARK_JARS_DIR = env.path("SPARK_JARS_DIR", default=str(BASE_DIR / ".local" / "spark-jars"))
