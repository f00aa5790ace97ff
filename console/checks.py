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
