"""Proof of the delivery guarantees: a delivery checker, fault-injection scenarios on a
3-broker KRaft cluster, and the generated results report. Installed in local and test
settings only, never in production."""
