import django_filters

from console.api.fields import DateTimeFilter
from console.api.filters import DeliveryFilter
from inbox.models import InboxMessage


class InboxMessageFilter(DeliveryFilter):
    id = django_filters.NumberFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=InboxMessage.Status.choices)
    consumer_group = django_filters.CharFilter(field_name="consumer_group")
    event_id = django_filters.CharFilter(field_name="event_id")
    received_after = DateTimeFilter(field_name="received_at", lookup_expr="gte")
    received_before = DateTimeFilter(field_name="received_at", lookup_expr="lt")
    processed_after = DateTimeFilter(field_name="processed_at", lookup_expr="gte")
    processed_before = DateTimeFilter(field_name="processed_at", lookup_expr="lt")

    class Meta:
        model = InboxMessage
        fields: list[str] = []
