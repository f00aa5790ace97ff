from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from console.api.exceptions import error_body


class BodySizeLimitMiddleware:
    """Refuses an API request whose declared body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE.

    Django checks that limit only when a view reads `request.body`; DRF's parsers read the
    stream instead, so the API needs this check to keep its promise of a bounded body.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > limit:
                return JsonResponse(
                    error_body(
                        "request_too_large",
                        f"The request body is {length} bytes; the limit is {limit}. "
                        "Send fewer ids, or select the rows by filter.",
                    ),
                    status=400,
                )
        return self.get_response(request)
