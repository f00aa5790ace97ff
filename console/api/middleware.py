from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import NoReverseMatch, reverse

from console.api.exceptions import error_body


def is_api_path(path: str) -> bool:
    """Whether `path` lies under the API, wherever the project mounts console.api.urls
    (path("ops/api/", include(...)) puts it under /ops/api/)."""
    try:
        # The schema sits at the API's root; its address gives the project's prefix.
        root = reverse("api-schema").removesuffix("schema/")
    except NoReverseMatch:  # the project does not mount the API
        return False
    return path.startswith(root)


class BodySizeLimitMiddleware:
    """Refuses an API request whose declared body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE.

    Django checks that limit only when a view reads `request.body`; DRF's parsers read the
    stream instead, so the API needs this check to keep its promise of a bounded body.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and is_api_path(request.path):
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
