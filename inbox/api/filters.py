import django_filters

from inbox.models import InboxMessage


class InboxMessageFilter(django_filters.FilterSet):
    """The admin's filters. Exact matches only: each is served by an index."""

    id = django_filters.NumberFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=InboxMessage.Status.choices)
    discarded = django_filters.BooleanFilter(
        field_name="discarded_at", lookup_expr="isnull", exclude=True
    )
    consumer_group = django_filters.CharFilter(field_name="consumer_group")
    event_id = django_filters.CharFilter(field_name="event_id")
    event_type = django_filters.CharFilter(field_name="event_type")
    aggregate_type = django_filters.CharFilter(field_name="aggregate_type")
    aggregate_id = django_filters.CharFilter(field_name="aggregate_id")
    topic = django_filters.CharFilter(field_name="topic")
    key = django_filters.CharFilter(field_name="key")
    received_after = django_filters.IsoDateTimeFilter(field_name="received_at", lookup_expr="gte")
    received_before = django_filters.IsoDateTimeFilter(field_name="received_at", lookup_expr="lt")
    processed_after = django_filters.IsoDateTimeFilter(field_name="processed_at", lookup_expr="gte")
    processed_before = django_filters.IsoDateTimeFilter(field_name="processed_at", lookup_expr="lt")

    class Meta:
        model = InboxMessage
        fields: list[str] = []
