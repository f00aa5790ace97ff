import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings

from project.settings.environment import PRODUCTION_REQUIRED_VARIABLES

PRODUCTION_ENVIRONMENT = {
    "DJANGO_SETTINGS_MODULE": "project.settings.production",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "DATABASE_URL": "postgres://outbox:secret@db.internal:5432/outbox",
    "KAFKA_BOOTSTRAP_SERVERS": "kafka-1.internal:9092,kafka-2.internal:9092",
    "ALLOWED_HOSTS": "events.example.com",
}


def manage(*arguments: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A clean environment: no variable of the test run leaks into the settings under test.
    base = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG")}
    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=settings.BASE_DIR,
        env={**base, **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_pass_the_deploy_check():
    result = manage(
        "check", "--deploy", "--fail-level", "WARNING", environment=PRODUCTION_ENVIRONMENT
    )
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.parametrize("variable", PRODUCTION_REQUIRED_VARIABLES)
def test_production_start_up_names_a_missing_variable(variable):
    environment = {key: value for key, value in PRODUCTION_ENVIRONMENT.items() if key != variable}
    result = manage("check", environment=environment)
    assert result.returncode != 0
    assert f"Set the {variable} environment variable" in result.stderr


def test_development_defaults_need_no_environment():
    result = manage("check", environment={})
    assert result.returncode == 0, result.stderr


def test_production_closes_metrics_and_health_until_their_tokens_are_set():
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.MONITORING_OPEN_WITHOUT_TOKEN)",
        environment=PRODUCTION_ENVIRONMENT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("days", ["0", "366"])
def test_an_api_token_lifetime_beyond_a_year_stops_start_up(days):
    result = manage("check", environment={"API_TOKEN_TTL_DAYS": days})
    assert result.returncode != 0
    assert f"API_TOKEN_TTL_DAYS is {days}; a token lives 1 to 365 days." in result.stderr
