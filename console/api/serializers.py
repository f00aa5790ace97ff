"""Input and output of the actions every API offers: a note, a bulk selection (ids or the
list's filters, with a dry run) and the bulk result."""

from typing import Any

from django.conf import settings
from rest_framework import serializers


class ActionInputSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class BulkInputSerializer(ActionInputSerializer):
    """A bulk action's selection. Subclasses declare `ids` with their model's id field."""

    ids: serializers.ListField
    filter = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        help_text='The list endpoint\'s filters, e.g. {"status": "FAILED"}.',
    )
    dry_run = serializers.BooleanField(default=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError("Give either 'ids' or 'filter', not both or none.")
        if len(attrs.get("ids", ())) > settings.API_BULK_MAX_IDS:
            raise serializers.ValidationError(
                f"At most {settings.API_BULK_MAX_IDS} ids per request; select by filter instead."
            )
        return attrs


class BulkResultSerializer(serializers.Serializer):
    action = serializers.CharField(read_only=True)
    dry_run = serializers.BooleanField(read_only=True)
    matched = serializers.IntegerField(read_only=True)
    changed = serializers.IntegerField(read_only=True, allow_null=True)
    queued_chunks = serializers.IntegerField(read_only=True)
    audit_id = serializers.IntegerField(read_only=True, allow_null=True)
