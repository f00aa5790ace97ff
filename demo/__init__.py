"""A demo of the product: payments publish PaymentCompleted through the outbox, a delivery
service consumes them through the inbox and starts deliveries. Installed only when
DEMO_ENABLED; it never touches the outbox, inbox or analytics apps' code."""
