from typing import Any

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import connection
from django.db.models import Field, IntegerField, QuerySet
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.views import APIView

from console.api.exceptions import ConsoleAPIError


def _invalid_cursor() -> ConsoleAPIError:
    return ConsoleAPIError(
        "invalid_cursor",
        "The cursor is not one this list gave; follow the `next` and `previous` links, or "
        "start again without a cursor.",
    )


class ConsoleCursorPagination(CursorPagination):
    """Cursor pagination: constant cost per page however deep, and stable while rows arrive.

    Views set `ordering` to an indexed column; no COUNT(*) is ever run. A cursor that does not
    decode, or whose position is no value of the ordering column, is bad input (400
    invalid_cursor), not a missing page.
    """

    page_size_query_param = "page_size"
    max_page_size = 500

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise _invalid_cursor() from None

    def paginate_queryset(
        self, queryset: Any, request: Request, view: APIView | None = None
    ) -> list[Any] | None:
        cursor = self.decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            # The views order by their pagination class's `ordering` (no OrderingFilter).
            first = self.ordering if isinstance(self.ordering, str) else self.ordering[0]
            self._check_position(queryset, first.lstrip("-"), cursor.position)
        return super().paginate_queryset(queryset, request, view)

    @staticmethod
    def _check_position(queryset: QuerySet, name: str, position: Any) -> None:
        """Refuses a position the ordering column cannot hold, before the database does."""
        try:
            field: Field = queryset.model._meta.get_field(name)
        except FieldDoesNotExist:
            return
        try:
            value = field.to_python(position)
        except (ValidationError, ValueError, TypeError, OverflowError):
            raise _invalid_cursor() from None
        if isinstance(field, IntegerField):
            low, high = connection.ops.integer_field_range(field.get_internal_type())
            if not low <= value <= high:
                raise _invalid_cursor()


class AttemptPagination(ConsoleCursorPagination):
    # Oldest first: the attempts of one event or message, in the order they were written.
    ordering = "id"
