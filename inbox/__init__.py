"""Transactional inbox for Kafka consumers: `from inbox import handler`."""

from inbox.registry import handler

__all__ = ["handler"]
