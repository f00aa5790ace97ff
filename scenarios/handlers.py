"""The scenario handler: records every run in ScenarioEffect.

Registered only in processes the scenario runner starts (it sets SCENARIO_TOPIC and
SCENARIO_GROUP): a developer's `inbox_consume --list-groups`, scripts/run.sh and the test
suite's registry never see it, and production does not install the app at all."""

import os
import zlib

from inbox import handler
from inbox.models import InboxMessage
from scenarios.conf import EVENT_TYPE, FAILURE_PERCENT_VARIABLE, handler_target
from scenarios.models import ScenarioEffect


class ScenarioHandlerFailure(Exception):
    """The first attempt of an event that the handler-failures scenario picked."""


def first_attempt_fails(message: InboxMessage, *, run: str, percent: int) -> bool:
    digest = zlib.crc32(f"{run}:{message.event_id}".encode())
    return message.attempts == 0 and digest % 100 < percent


def apply_effect(message: InboxMessage, *, run: str) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    ScenarioEffect.objects.create(
        run=run,
        consumer_group=message.consumer_group,
        event_id=message.event_id,
        key=message.key or "",
        seq=int(payload.get("seq", -1)),
        pid=os.getpid(),
    )


_target = handler_target()
if _target is not None:
    _topic, _group, _run = _target

    _failure_percent = int(os.environ.get(FAILURE_PERCENT_VARIABLE) or 0)

    @handler(event_type=EVENT_TYPE, topic=_topic, group=_group)
    def scenario_effect(message: InboxMessage) -> None:
        if _failure_percent and first_attempt_fails(message, run=_run, percent=_failure_percent):
            raise ScenarioHandlerFailure(f"first attempt of {message.event_id} fails")
        apply_effect(message, run=_run)
