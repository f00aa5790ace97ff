from typing import Any

from celery import shared_task
from django.db import OperationalError

from console.bulk_operations import (
    bulk_action_apply_chunk,
    bulk_operation_run,
    bulk_operations_reap,
)


@shared_task(
    name="console.run_bulk_operation",
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def run_bulk_operation(operation_id: int) -> None:
    bulk_operation_run(operation_id=operation_id)


@shared_task(
    name="console.apply_action_chunk",
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def apply_action_chunk(action_id: int, object_ids: list[Any]) -> int:
    # Drains chunks queued by earlier versions; new bulk actions run as run_bulk_operation.
    return bulk_action_apply_chunk(action_id=action_id, object_ids=object_ids)


@shared_task(name="console.reap_bulk_operations", ignore_result=True)
def reap_bulk_operations() -> None:
    # Beat runs it every minute (project/settings/schedule.py); the next tick is the retry.
    bulk_operations_reap()
