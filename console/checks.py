from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from console.privacy import MaskedFieldError, masked_field_paths


@register()
def check_trace_url_template(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    template = settings.CONSOLE_TRACE_URL_TEMPLATE
    if not template:
        return []
    problem = ""
    try:
        url = template.format(trace_id="0" * 32)
    except (KeyError, IndexError, ValueError) as error:
        problem = f"it must name no placeholder but {{trace_id}} ({error!r})"
    else:
        if "{trace_id}" not in template:
            problem = "it has no {trace_id}"
        elif urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            problem = "it is not an http:// or https:// URL"
    if not problem:
        return []
    return [
        Error(
            f"CONSOLE_TRACE_URL_TEMPLATE {template!r} is not a trace URL template: {problem}.",
            hint="For example http://127.0.0.1:9411/zipkin/traces/{trace_id} (Zipkin).",
            id="console.E001",
        )
    ]


@register()
def check_masked_fields(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    try:
        masked_field_paths(settings.CONSOLE_MASKED_FIELDS)
    except MaskedFieldError as error:
        return [Error(f"CONSOLE_MASKED_FIELDS: {error}", id="console.E002")]
    return []


@register()
def check_bulk_settings(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The bulk actions' knobs: a chunk and a selection of at least one row, a rate cap of no
    fewer than zero rows per second (0: no cap), no fewer than zero resumes. A chunk larger
    than the cap is allowed, but then every chunk is followed by a pause of more than a
    second."""
    problems: list[CheckMessage] = []
    for name, minimum in (
        ("CONSOLE_BULK_CHUNK_SIZE", 1),
        ("CONSOLE_BULK_MAX_ROWS", 1),
        ("CONSOLE_BULK_MAX_ROWS_PER_SECOND", 0),
        ("CONSOLE_BULK_MAX_RESUMES", 0),
    ):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            problems.append(
                Error(
                    f"{name} is {value!r}; it must be a whole number of at least {minimum}.",
                    hint="See docs/console.md, 'Bulk actions'.",
                    id="console.E003",
                )
            )
    return problems
