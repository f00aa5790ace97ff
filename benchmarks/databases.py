"""The benchmarks' own databases, beside the one DATABASE_URL names: same server and role,
a name with a suffix, so that a benchmark never touches development data."""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import environ
import psycopg

DEFAULT_DATABASE_URL = "postgres://outbox:outbox@127.0.0.1:5432/outbox"


def sibling_database_url(suffix: str) -> str:
    url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    config = environ.Env.db_url_config(url)
    return (
        f"postgres://{config['USER']}:{config['PASSWORD']}@{config['HOST']}:"
        f"{config['PORT'] or 5432}/{config['NAME']}{suffix}"
    )


@contextmanager
def server_connection(url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the server's maintenance database, to create or drop
    the database that url names."""
    config = environ.Env.db_url_config(url)
    with psycopg.connect(
        host=config["HOST"],
        port=config["PORT"] or 5432,
        user=config["USER"],
        password=config["PASSWORD"],
        dbname="postgres",
        autocommit=True,
    ) as connection:
        yield connection


def database_name(url: str) -> str:
    return str(environ.Env.db_url_config(url)["NAME"])


def ensure_database(url: str) -> bool:
    """Creates the database if it is missing; returns whether it did."""
    name = database_name(url)
    with server_connection(url) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        connection.execute(f'CREATE DATABASE "{name}"')
        return True


def recreate_database(url: str) -> None:
    name = database_name(url)
    with server_connection(url) as connection:
        # An autovacuum worker in the old database can hold the drop off for a moment.
        for attempt in range(30):
            try:
                connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.errors.InsufficientPrivilege:
                if attempt == 29:
                    raise
                time.sleep(1)
        connection.execute(f'CREATE DATABASE "{name}"')
