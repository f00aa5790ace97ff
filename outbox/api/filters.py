import django_filters

from outbox.models import OutboxEvent


class OutboxEventFilter(django_filters.FilterSet):
    """The admin's filters. Exact matches only: each is served by an index."""

    id = django_filters.UUIDFilter(field_name="id")
    status = django_filters.ChoiceFilter(choices=OutboxEvent.Status.choices)
    event_type = django_filters.CharFilter(field_name="event_type")
    aggregate_type = django_filters.CharFilter(field_name="aggregate_type")
    aggregate_id = django_filters.CharFilter(field_name="aggregate_id")
    topic = django_filters.CharFilter(field_name="topic")
    key = django_filters.CharFilter(field_name="key")
    discarded = django_filters.BooleanFilter(
        field_name="discarded_at", lookup_expr="isnull", exclude=True
    )
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    published_after = django_filters.IsoDateTimeFilter(field_name="published_at", lookup_expr="gte")
    published_before = django_filters.IsoDateTimeFilter(field_name="published_at", lookup_expr="lt")

    class Meta:
        model = OutboxEvent
        fields: list[str] = []
