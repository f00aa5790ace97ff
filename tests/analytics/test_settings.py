from project.settings.analytics import _expected_consumers


def test_expected_consumers_are_parsed_by_topic_or_event_type() -> None:
    parsed = _expected_consumers(" orders=billing|shipping , user.deleted=audit,empty=")
    assert parsed == {"orders": ["billing", "shipping"], "user.deleted": ["audit"], "empty": []}
    assert _expected_consumers("") == {}
