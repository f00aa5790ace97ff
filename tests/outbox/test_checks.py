from outbox.checks import check_outbox_settings


def test_a_lease_shorter_than_the_delivery_timeout_is_an_error(settings):
    settings.OUTBOX_PRODUCER_DELIVERY_TIMEOUT_MS = 30_000
    settings.OUTBOX_LEASE_SECONDS = 30
    assert [error.id for error in check_outbox_settings(None)] == ["outbox.E001"]
    settings.OUTBOX_LEASE_SECONDS = 60
    assert check_outbox_settings(None) == []
