"""Security of the console and the API: login protection (django-axes), API tokens hashed at
rest (django-rest-knox) and the Content-Security-Policy (django-csp). docs/security.md."""

from datetime import timedelta

from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from project.settings.environment import env

# Axes checks a login before the password is tried: a locked-out user or address is refused
# even with the right password, until the cool-off ends or an operator unlocks it.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Failed logins that lock out a user name, and (counted apart) a client address.
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A failure during a lock-out does not extend it (else anyone could keep an operator locked
# out by trying every few minutes); a success does not clear earlier failures (an attacker who
# knows one password cannot reset an address's count with it).
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_RESET_ON_SUCCESS = False
# Every failed attempt is kept (not only the count per user and address), for the console.
AXES_ENABLE_ACCESS_FAILURE_LOG = True
# The console registers its own pages for attempts and lock-outs (console.admin.security).
AXES_ENABLE_ADMIN = False
AXES_CLIENT_IP_CALLABLE = "console.security.login_client_address"
AXES_LOCKOUT_TEMPLATE = "admin/console/login_locked_out.html"
# How many reverse proxies in front of the console append to X-Forwarded-For. 0: the
# client's address is the connection's (REMOTE_ADDR); a forged header is ignored.
LOGIN_TRUSTED_PROXY_COUNT = env.int("LOGIN_TRUSTED_PROXY_COUNT", default=0)

# Where a login goes when its `next` is missing or off-site (Django checks it against the
# host): the console, not Django's default /accounts/profile/.
LOGIN_REDIRECT_URL = "admin:index"

# A console session lasts a working shift, then its operator logs in again (OWASP ASVS 3.3.2).
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=8 * 60 * 60)

# API tokens: SHA-512 digests at rest (knox), each with a name, an expiry and a scope.
KNOX_TOKEN_MODEL = "console.ApiToken"  # noqa: S105 (a model name)
# knox's own migrations create its default token table even when the model is swapped: the
# app runs without them (its only model is replaced by ApiToken).
MIGRATION_MODULES = {"knox": None}
API_TOKEN_TTL_DAYS = env.int("API_TOKEN_TTL_DAYS", default=90)
if not 1 <= API_TOKEN_TTL_DAYS <= 365:
    raise ImproperlyConfigured(
        f"API_TOKEN_TTL_DAYS is {API_TOKEN_TTL_DAYS}; a token lives 1 to 365 days."
    )
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=API_TOKEN_TTL_DAYS),
    # A recognisable prefix lets secret scanners find a leaked token.
    "TOKEN_PREFIX": "console_",
    "AUTH_HEADER_PREFIX": "Token",
}

# No inline script runs unless it carries the response's nonce. Unfold's admin is built on the
# standard Alpine.js, which evaluates its attribute expressions with Function(): without
# 'unsafe-eval' its menus, filters and tabs stop working. Inline styles are allowed: Unfold's
# layout writes its theme colours in a <style> element, htmx adds one, and Unfold's templates
# and the console's admin columns use style attributes; styles run no code. Images and fonts
# come from the console only (the API's Swagger UI page adds data: images for its icons:
# console/api/urls.py).
# django-celery-beat's periodic task form has one inline script of its own, allowed by its hash
# (of the script as django-celery-beat 2.9.0 renders it in English; another version's script
# is refused, and the form still saves without it: it only explains the crontab chosen).
PERIODIC_TASK_FORM_SCRIPT = "'sha256-QE3U2xYF7B4J2ro1/9oxiKhaWCGW39gB7ocQ/xlD0bE='"
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE, "'unsafe-eval'", PERIODIC_TASK_FORM_SCRIPT],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}
