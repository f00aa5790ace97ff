from typing import Any

from celery import shared_task
from django.db import OperationalError

from console.operations import bulk_action_apply_chunk


@shared_task(
    name="console.apply_action_chunk",
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def apply_action_chunk(action_id: int, object_ids: list[Any]) -> int:
    return bulk_action_apply_chunk(action_id=action_id, object_ids=object_ids)
