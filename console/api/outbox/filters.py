import django_filters

from console.api.filters import DeliveryFilter
from outbox.models import OutboxEvent


class OutboxEventFilter(DeliveryFilter):
    id = django_filters.UUIDFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=OutboxEvent.Status.choices)
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    published_after = django_filters.IsoDateTimeFilter(field_name="published_at", lookup_expr="gte")
    published_before = django_filters.IsoDateTimeFilter(field_name="published_at", lookup_expr="lt")

    class Meta:
        model = OutboxEvent
        fields: list[str] = []
