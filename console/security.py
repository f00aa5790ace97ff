"""The client address that login protection (django-axes) counts failures against."""

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def login_client_address(request: HttpRequest) -> str:
    """The address of the client: the connection's, or, behind LOGIN_TRUSTED_PROXY_COUNT
    reverse proxies, the one the outermost trusted proxy saw (the proxies append to
    X-Forwarded-For, so entries left of theirs may be forged by the client)."""
    remote_address = request.META.get("REMOTE_ADDR", "")
    trusted_proxies = settings.LOGIN_TRUSTED_PROXY_COUNT
    if trusted_proxies <= 0:
        return remote_address
    forwarded = [
        address.strip()
        for address in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
        if address.strip()
    ]
    if len(forwarded) < trusted_proxies:
        return remote_address
    address = forwarded[-trusted_proxies]
    try:
        # axes stores it in an address column: "ip:port", "unknown" and the like are no address.
        return str(ipaddress.ip_address(address))
    except ValueError:
        return remote_address
