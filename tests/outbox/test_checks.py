from outbox.checks import check_outbox_settings


def test_a_relay_interval_beat_cannot_store_is_an_error(settings):
    for interval in (0.5, 1.5, 0):
        settings.OUTBOX_RELAY_INTERVAL = interval
        assert [error.id for error in check_outbox_settings(None)] == ["outbox.E005"]
    settings.OUTBOX_RELAY_INTERVAL = 2.0
    assert check_outbox_settings(None) == []


def test_stale_relay_ticks_expire_instead_of_piling_up(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["outbox-relay"]
    assert entry["options"]["expires"] >= 3 * entry["schedule"]
