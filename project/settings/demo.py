"""The demo: payments publish PaymentCompleted through the outbox, a delivery service consumes
them through the inbox and may publish DeliveryStarted. Off in production."""

from project.settings.environment import env

DEMO_ENABLED = env.bool("DEMO_ENABLED", default=True)
DEMO_PAYMENTS_TOPIC = env("DEMO_PAYMENTS_TOPIC", default="demo.payments")
DEMO_DELIVERIES_TOPIC = env("DEMO_DELIVERIES_TOPIC", default="demo.deliveries")
DEMO_DELIVERY_GROUP = env("DEMO_DELIVERY_GROUP", default="demo-delivery")
# Payments completed per second by `manage.py demo_traffic`.
DEMO_RATE = env.float("DEMO_RATE", default=2.0)
# Share of handler runs that raise, to show retries and FAILED inbox rows (0..1).
DEMO_HANDLER_FAILURE_RATE = env.float("DEMO_HANDLER_FAILURE_RATE", default=0.1)
# Share of published payments whose Kafka record is sent a second time, as a broker or a
# producer retry would: the inbox counts it as a duplicate (0..1).
DEMO_DUPLICATE_RATE = env.float("DEMO_DUPLICATE_RATE", default=0.05)
# The delivery handler publishes DeliveryStarted through the outbox (a chain of services).
DEMO_CHAIN = env.bool("DEMO_CHAIN", default=True)
