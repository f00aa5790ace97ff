from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
# A `.env` file beside manage.py is optional; real environment variables win over it.
if (BASE_DIR / ".env").is_file():
    env.read_env(BASE_DIR / ".env", overwrite=False)

# Production start-up stops, naming the variable, when one of these is missing.
PRODUCTION_REQUIRED_VARIABLES = ("SECRET_KEY", "DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")
