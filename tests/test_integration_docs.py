"""docs/integration.md lists every setting of KAFKA_EVENTS, OUTBOX and INBOX with its default,
exactly as kafka_events/conf.py, outbox/conf.py and inbox/conf.py define them: no key missing,
none left over, no default stale."""

import re
from pathlib import Path

import pytest
from django.conf import settings

from inbox.conf import inbox_settings
from kafka_events.conf import AppSettings, kafka_settings
from outbox.conf import outbox_settings

DOC = Path(settings.BASE_DIR) / "docs" / "integration.md"
ROW = re.compile(r"^\| `(?P<key>[A-Z_]+)` \| `(?P<default>[^`]*)` \|", re.M)


def documented_defaults(setting_name: str) -> dict[str, str]:
    """{key: default as written} of the table under the heading "### `SETTING_NAME`"."""
    text = DOC.read_text()
    heading = f"### `{setting_name}`\n"
    assert heading in text, f"docs/integration.md has no section for {setting_name}"
    table = text.split(heading, 1)[1].split("\n#", 1)[0]
    return {row["key"]: row["default"] for row in ROW.finditer(table)}


@pytest.mark.parametrize(
    "conf", [kafka_settings, outbox_settings, inbox_settings], ids=lambda conf: conf.setting_name
)
def test_the_doc_lists_every_key_with_its_default(conf: AppSettings):
    assert documented_defaults(conf.setting_name) == {
        key: repr(default) for key, default in conf.defaults.items()
    }
