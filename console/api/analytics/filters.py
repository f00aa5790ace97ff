from typing import Any

import django_filters
from django import forms

from analytics.models import (
    AnalyticsRun,
    DeliveryLagStat,
    DuplicateStat,
    ReconciliationFinding,
    RelayStat,
)
from console.api.fields import DateTimeFilter


class RangeForm(forms.Form):
    """Refuses a range whose start is not before its end, naming both parameters."""

    ranges: tuple[tuple[str, str], ...] = ()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for low, high in self.ranges:
            if data.get(low) and data.get(high) and data[low] >= data[high]:
                raise forms.ValidationError(
                    f"{low} ({data[low].isoformat()}) must be before {high} "
                    f"({data[high].isoformat()})."
                )
        return data


class HourRangeForm(RangeForm):
    ranges = (("hour_after", "hour_before"),)


class RunRangeForm(RangeForm):
    ranges = (("window_after", "window_before"),)


class HourlyFilter(django_filters.FilterSet):
    """An hour is the UTC hour in which the events were created: hour_after <= hour <
    hour_before. `run` picks one run's rows instead of the latest run's for each hour."""

    hour_after = DateTimeFilter(field_name="hour", lookup_expr="gte")
    hour_before = DateTimeFilter(field_name="hour", lookup_expr="lt")
    topic = django_filters.CharFilter(field_name="topic")
    run = django_filters.NumberFilter(field_name="run_id")


class DeliveryLagStatFilter(HourlyFilter):
    event_type = django_filters.CharFilter(field_name="event_type")
    consumer_group = django_filters.CharFilter(field_name="consumer_group")
    stage = django_filters.ChoiceFilter(choices=DeliveryLagStat.Stage.choices)

    class Meta:
        model = DeliveryLagStat
        fields: list[str] = []
        form = HourRangeForm


class DuplicateStatFilter(HourlyFilter):
    consumer_group = django_filters.CharFilter(field_name="consumer_group")

    class Meta:
        model = DuplicateStat
        fields: list[str] = []
        form = HourRangeForm


class RelayStatFilter(HourlyFilter):
    class Meta:
        model = RelayStat
        fields: list[str] = []
        form = HourRangeForm


class AnalyticsRunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=AnalyticsRun.Status.choices)
    trigger = django_filters.ChoiceFilter(choices=AnalyticsRun.Trigger.choices)
    # Runs whose window overlaps [window_after, window_before).
    window_after = DateTimeFilter(field_name="window_end", lookup_expr="gt")
    window_before = DateTimeFilter(field_name="window_start", lookup_expr="lt")

    class Meta:
        model = AnalyticsRun
        fields: list[str] = []
        form = RunRangeForm


class ReconciliationFindingFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=ReconciliationFinding.Kind.choices)
    run = django_filters.NumberFilter(field_name="run_id")
    event_id = django_filters.UUIDFilter(method="filter_event_id")
    topic = django_filters.CharFilter(field_name="topic")
    consumer_group = django_filters.CharFilter(field_name="consumer_group")

    class Meta:
        model = ReconciliationFinding
        fields: list[str] = []

    def filter_event_id(self, queryset: Any, name: str, value: Any) -> Any:
        # Stored as the outbox's text form of the UUID.
        return queryset.filter(event_id=str(value))
