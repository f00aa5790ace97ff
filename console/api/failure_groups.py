"""Failure groups of the API: the admin's failure-groups page as JSON, and "retry this group" /
"discard this group" as bulk actions over the group's rows, with a dry run.

The groups are read by console.selectors.failure_groups and a group's rows by
failure_group_rows (the same FAILED rows, the same error class), and acted on through
console.bulk_operations like any bulk action: a reason, the audit log, a bulk operation for a
large group (202 and its URL).
"""

from typing import Any

from django.db.models import Model
from django.urls import reverse
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from console.api.bulk import bulk_rows_response
from console.api.exceptions import ConsoleAPIError
from console.api.filters import RESERVED_PARAMETERS
from console.api.permissions import view_permission
from console.api.serializers import bulk_reason_field, bulk_results_schema
from console.models import OperatorAction
from console.selectors import (
    FAILURE_GROUPS_SHOWN,
    NO_ERROR_TEXT,
    FailureGroup,
    failure_group_rows,
    failure_groups,
)
from inbox.models import InboxMessage, InboxMessagePermission
from outbox.models import OutboxEvent, OutboxEventPermission

Action = OperatorAction.Action
BULK_RESULTS = bulk_results_schema()


class FailureGroupSerializer(serializers.Serializer):
    """FAILED rows of one error class on one topic that no operator discarded."""

    error_class = serializers.CharField(
        read_only=True,
        help_text=f"The text before ':' on the first line of the error; {NO_ERROR_TEXT!r} for "
        "rows without error text.",
    )
    topic = serializers.CharField(read_only=True)
    count = serializers.IntegerField(read_only=True)
    first_seen = serializers.DateTimeField(read_only=True)
    last_seen = serializers.DateTimeField(read_only=True)
    sample_error = serializers.CharField(
        read_only=True, help_text="The error of the group's latest row."
    )
    sample_url = serializers.SerializerMethodField(
        help_text="The API's detail of the group's latest row."
    )
    # Named by the view: the detail route of the rows' model.
    detail_route = ""

    def get_sample_url(self, group: FailureGroup) -> str:
        url = reverse(self.detail_route, args=[group.sample_id])
        request = self.context.get("request")
        return request.build_absolute_uri(url) if request is not None else url


class OutboxFailureGroupSerializer(FailureGroupSerializer):
    """Outbox events whose attempts are spent (held heads): first and last seen are when they
    began to hold their keys."""

    sample_id = serializers.UUIDField(read_only=True, help_text="The group's latest event.")
    detail_route = "outbox-event-detail"


class InboxFailureGroupSerializer(FailureGroupSerializer):
    """FAILED inbox messages of one consumer group: first and last seen are when the first and
    the last were received."""

    consumer_group = serializers.CharField(read_only=True)
    sample_id = serializers.IntegerField(read_only=True, help_text="The group's latest message.")
    detail_route = "inbox-message-detail"


class FailureGroupActionInputSerializer(serializers.Serializer):
    """One group, named by the fields its list gives, and the bulk action's dry run and
    reason."""

    # As the list gives them: spaces are part of an error class or a topic.
    error_class = serializers.CharField(trim_whitespace=False)
    topic = serializers.CharField(max_length=249, trim_whitespace=False)
    dry_run = serializers.BooleanField(
        default=False, help_text="Only count the group's rows now (`matched`); change nothing."
    )
    reason = bulk_reason_field()


class InboxFailureGroupActionInputSerializer(FailureGroupActionInputSerializer):
    consumer_group = serializers.CharField(max_length=255, trim_whitespace=False)


class FailureGroupViewSet(viewsets.ViewSet):
    """The failure groups of one side, the largest first (at most FAILURE_GROUPS_SHOWN), and
    the retry or discard of one group's rows as they are now."""

    side: str
    model: type[Model]
    retry_action: str
    discard_action: str
    output_serializer: type[FailureGroupSerializer]
    input_serializer: type[FailureGroupActionInputSerializer]
    required_permissions: dict[str, list[str]]

    def get_throttles(self) -> list[BaseThrottle]:
        self.throttle_scope = "" if self.action == "list" else "actions"
        return super().get_throttles()

    def list(self, request: Request) -> Response:
        # No filters: a parameter a client means as one must not silently return every group.
        unknown = sorted(set(request.query_params) - RESERVED_PARAMETERS)
        if unknown:
            raise ConsoleAPIError(
                "unknown_filter",
                f"Unknown filter {', '.join(unknown)}; the failure groups take no filters.",
            )
        groups = failure_groups(self.side)
        serializer = self.output_serializer(groups, many=True, context={"request": request})
        return Response(serializer.data)

    def _act(self, request: Request, action_name: str) -> Response:
        data = self.input_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        group = {
            name: data.validated_data[name]
            for name in ("error_class", "topic", "consumer_group")
            if name in data.validated_data
        }
        rows = failure_group_rows(self.side, **group)
        if not rows.exists():
            raise ConsoleAPIError(
                "unknown_failure_group",
                f"No {self.model._meta.verbose_name_plural} have failed for good in this group "
                f"({', '.join(f'{key}={value!r}' for key, value in group.items())}); it may have "
                "been retried or discarded since. List the groups again.",
            )
        return bulk_rows_response(
            request=request,
            action=action_name,
            rows=rows,
            dry_run=data.validated_data["dry_run"],
            reason=data.validated_data["reason"],
            filters={"failure_group": group},
        )

    @action(detail=False, methods=["post"])
    def retry(self, request: Request) -> Response:
        return self._act(request, self.retry_action)

    @action(detail=False, methods=["post"])
    def discard(self, request: Request) -> Response:
        return self._act(request, self.discard_action)


def _permissions(model: type[Model], retry: str, discard: str) -> dict[str, list[str]]:
    view = view_permission(model)
    return {"list": [view], "retry": [view, retry], "discard": [view, discard]}


LIST_DESCRIPTION = (
    "FAILED rows that no operator discarded, grouped by error class and topic{by_group}: each "
    "group's count, first and last seen, and its latest row as a sample; the largest groups "
    f"first, at most {FAILURE_GROUPS_SHOWN}."
)
RETRY_DESCRIPTION = (
    "Retries the rows of one group as they are now, frozen at the request, like bulk/retry; "
    "dry_run only counts them. 400 unknown_failure_group when the group has no rows."
)
DISCARD_DESCRIPTION = (
    "Discards the rows of one group as they are now, frozen at the request, like bulk/discard; "
    "dry_run only counts them. 400 unknown_failure_group when the group has no rows."
)


def _schemas(
    output_serializer: type[FailureGroupSerializer],
    input_serializer: type[FailureGroupActionInputSerializer],
    *,
    by_group: str,
) -> dict[str, Any]:
    """The schema of each operation of one side's failure groups."""
    return {
        "list": extend_schema(
            responses=output_serializer(many=True),
            description=LIST_DESCRIPTION.format(by_group=by_group),
        ),
        "retry": extend_schema(
            request=input_serializer, responses=BULK_RESULTS, description=RETRY_DESCRIPTION
        ),
        "discard": extend_schema(
            request=input_serializer, responses=BULK_RESULTS, description=DISCARD_DESCRIPTION
        ),
    }


@extend_schema_view(
    **_schemas(OutboxFailureGroupSerializer, FailureGroupActionInputSerializer, by_group="")
)
class OutboxFailureGroupViewSet(FailureGroupViewSet):
    """Outbox events that failed for good, grouped by error class and topic."""

    side = "outbox"
    model = OutboxEvent
    retry_action = Action.OUTBOX_RETRY
    discard_action = Action.OUTBOX_DISCARD
    output_serializer = OutboxFailureGroupSerializer
    input_serializer = FailureGroupActionInputSerializer
    required_permissions = _permissions(
        OutboxEvent, OutboxEventPermission.RETRY, OutboxEventPermission.DISCARD
    )


@extend_schema_view(
    **_schemas(
        InboxFailureGroupSerializer,
        InboxFailureGroupActionInputSerializer,
        by_group=" (and consumer group)",
    )
)
class InboxFailureGroupViewSet(FailureGroupViewSet):
    """Inbox messages that failed for good, grouped by error class, topic and consumer
    group."""

    side = "inbox"
    model = InboxMessage
    retry_action = Action.INBOX_RETRY
    discard_action = Action.INBOX_DISCARD
    output_serializer = InboxFailureGroupSerializer
    input_serializer = InboxFailureGroupActionInputSerializer
    required_permissions = _permissions(
        InboxMessage, InboxMessagePermission.RETRY, InboxMessagePermission.DISCARD
    )
