"""The console's admin pages, one module per subject; importing this package (Django's admin
autodiscovery does) registers them all."""

from console.admin import analytics, audit, bulk, inbox, outbox, security, tokens

__all__ = ("analytics", "audit", "bulk", "inbox", "outbox", "security", "tokens")
