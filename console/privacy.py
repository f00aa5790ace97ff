"""Payloads and headers are often personal data. The console shows them only to users with
the permission console.view_payload, and even to them with the fields CONSOLE_MASKED_FIELDS
names replaced by MASK, on the admin's pages and in the API alike.

A masked field is named by a path of keys from `payload` or `headers`, dot-separated, where
`*` stands for any key of an object or any item of a list:
"payload.customer.email", "payload.items.*.card_number", "headers.authorization"."""

import copy
from collections.abc import Iterable
from typing import Any

from django.conf import settings

VIEW_PAYLOAD = "console.view_payload"
MASK = "[masked]"
ROOTS = ("payload", "headers")


class MaskedFieldError(ValueError):
    """A CONSOLE_MASKED_FIELDS entry that names no field."""


def masked_field_paths(entries: Iterable[str]) -> dict[str, list[list[str]]]:
    """The entries split by root, each a list of keys; raises MaskedFieldError on an entry
    that does not start with a root or has an empty key."""
    paths: dict[str, list[list[str]]] = {root: [] for root in ROOTS}
    for entry in entries:
        root, *keys = entry.strip().split(".")
        if root not in ROOTS or not keys or any(not key for key in keys):
            raise MaskedFieldError(
                f"{entry!r}: a masked field is 'payload.' or 'headers.' followed by keys "
                "separated by dots ('*' for any key or list item), e.g. payload.customer.email"
            )
        paths[root].append(keys)
    return paths


def _mask(document: Any, keys: list[str]) -> None:
    """Replaces, in place, what `keys` names in `document`."""
    key, rest = keys[0], keys[1:]
    if isinstance(document, dict):
        names = list(document) if key == "*" else [key] if key in document else []
        for name in names:
            if rest:
                _mask(document[name], rest)
            else:
                document[name] = MASK
    elif isinstance(document, list):
        indexes = range(len(document)) if key == "*" else [int(key)] if key.isdigit() else []
        for index in indexes:
            if index >= len(document):
                continue
            if rest:
                _mask(document[index], rest)
            else:
                document[index] = MASK


def masked(document: Any, root: str) -> Any:
    """A copy of `document` (a payload or headers, as `root` says) with the masked fields
    replaced; the document itself when nothing is masked."""
    paths = masked_field_paths(settings.CONSOLE_MASKED_FIELDS)[root]
    if not paths or not isinstance(document, dict | list):
        return document
    copied = copy.deepcopy(document)
    for keys in paths:
        _mask(copied, keys)
    return copied


def may_view_payload(user: Any) -> bool:
    return bool(user is not None and user.has_perm(VIEW_PAYLOAD))
