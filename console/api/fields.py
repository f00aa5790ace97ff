"""Date-time inputs of the API (filters and bodies), refused with a 400 when the database could
not compare them: PostgreSQL takes UTC offsets up to 15:59 either way, where Python (and so
ISO 8601 parsing) takes up to 23:59; and a time at the edge of year 1 or 9999 has no UTC
value in Python. Values reach the queries in UTC."""

from datetime import UTC, datetime, timedelta
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField
from rest_framework import serializers

# PostgreSQL refuses a time zone displacement of 16 hours or more.
MAX_UTC_OFFSET = timedelta(hours=15, minutes=59)
OUT_OF_RANGE = "date_out_of_range"


def datetime_problem(value: datetime) -> str | None:
    """Why `value` (aware) cannot be used in a query, or None."""
    offset = value.utcoffset()
    if offset is not None and abs(offset) > MAX_UTC_OFFSET:
        return (
            f"The UTC offset of {value.isoformat()} is beyond what the database takes "
            "(-15:59 to +15:59); give the time in UTC (Z)."
        )
    try:
        value.astimezone(UTC)
    except OverflowError:
        return f"{value.isoformat()} has no UTC time between years 1 and 9999."
    return None


class BoundedIsoDateTimeField(IsoDateTimeField):
    """django-filter's ISO 8601 field, in UTC, within the database's range."""

    default_error_messages = {OUT_OF_RANGE: "%(problem)s"}

    def to_python(self, value: Any) -> datetime | None:
        parsed: datetime | None = super().to_python(value)
        if parsed is None:
            return None
        problem = datetime_problem(parsed)
        if problem:
            raise forms.ValidationError(
                self.error_messages[OUT_OF_RANGE], code=OUT_OF_RANGE, params={"problem": problem}
            )
        return parsed.astimezone(UTC)


class DateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 date-time filter that refuses values the database cannot compare."""

    field_class = BoundedIsoDateTimeField


class DateTimeField(serializers.DateTimeField):
    """DRF's date-time field, refusing the UTC offsets the database refuses."""

    default_error_messages = {OUT_OF_RANGE: "{problem}"}

    def enforce_timezone(self, value: datetime) -> datetime:
        problem = datetime_problem(value) if value.tzinfo is not None else None
        if problem:
            self.fail(OUT_OF_RANGE, problem=problem)
        return super().enforce_timezone(value)
