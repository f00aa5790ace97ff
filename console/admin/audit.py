"""The audit log of operator actions: read-only, for everyone with its view permission."""

from django.contrib import admin
from unfold.contrib.filters.admin import RangeDateTimeFilter
from unfold.decorators import display

from console.admin.base import EstimatedCountPaginator, ReadOnlyModelAdmin
from console.models import OperatorAction


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyModelAdmin):
    list_display = (
        "created_at",
        "username",
        "action",
        "model",
        "source",
        "requested",
        "changed",
        "chunks_pending",
        "short_reason",
        "short_note",
    )
    list_filter = ("action", "source", ("created_at", RangeDateTimeFilter))
    list_filter_submit = True
    search_fields = ("username",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = (
        "created_at",
        "user",
        "username",
        "action",
        "model",
        "source",
        "requested",
        "changed",
        "chunks_pending",
        "filters",
        "object_ids",
        "reason",
        "note",
    )

    @display(description="Reason")
    def short_reason(self, entry: OperatorAction) -> str:
        return entry.reason[:80]

    @display(description="Note")
    def short_note(self, entry: OperatorAction) -> str:
        return entry.note[:80]
