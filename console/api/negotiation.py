from collections.abc import Iterable

from django.http import Http404
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer


class ConsoleContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, with a `?format=` the API has no renderer for refused as 406
    not_acceptable, as an Accept header is, rather than as a missing page (404)."""

    def filter_renderers(
        self, renderers: Iterable[BaseRenderer], format: str
    ) -> list[BaseRenderer]:
        renderers = list(renderers)
        try:
            return super().filter_renderers(renderers, format)
        except Http404:
            formats = ", ".join(str(renderer.format) for renderer in renderers)
            raise NotAcceptable(f"No format {format!r}; the formats are {formats}.") from None
