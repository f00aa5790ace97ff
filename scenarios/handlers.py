"""The scenario handler: records every run in ScenarioEffect.

Registered only in processes the scenario runner starts (it sets SCENARIO_TOPIC and
SCENARIO_GROUP): a developer's `inbox_consume --list-groups`, scripts/run.sh and the test
suite's registry never see it, and production does not install the app at all."""

import os

from inbox import handler
from inbox.models import InboxMessage
from scenarios.conf import EVENT_TYPE, handler_target
from scenarios.models import ScenarioEffect


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

    @handler(event_type=EVENT_TYPE, topic=_topic, group=_group)
    def scenario_effect(message: InboxMessage) -> None:
        apply_effect(message, run=_run)
