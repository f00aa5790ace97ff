"""Writes to the outbox, one module per job: publish (business code), nudge (the on-commit
wake-up of the relay), event_log (the relay's reads and records, a package of one module per
job), repairs (the operators' retry, discard, replay and key release), partitions (the day
partitions of the event and delivery tables), retention (dropping what the relay no longer
needs)."""
