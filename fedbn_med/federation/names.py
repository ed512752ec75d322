"""Two rules every layer shares: what a plain name is, and which hosts are this host.

A site's name (and a federation's id) names files and folders at the sites and on the
server, so it is 1 to 64 letters, digits, ``-`` or ``_``: no separator, no dot, no
space. Loopback is 127.0.0.0/8, ``::1`` (also written ``[::1]``) and ``localhost``.

This module imports only the standard library, so the site files, the command line,
the consortium's keys and the server's reply checks all read it cheaply.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TypeGuard

__all__ = ["LOOPBACK_HOSTS", "NAME_RULE", "SITE_NAME", "check_name", "is_loopback",
           "is_plain_name"]

#: A site's name (or a federation's id): it names files and folders, so only these.
SITE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: :data:`SITE_NAME` in words, for error messages.
NAME_RULE = "1 to 64 letters, digits, '-' or '_'"
#: One name of each kind for this host: what a server certificate lists so that the
#: server's own processes can reach it on loopback.
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def is_plain_name(value: object) -> TypeGuard[str]:
    """Return whether ``value`` is a string that :data:`SITE_NAME` matches whole."""
    return isinstance(value, str) and SITE_NAME.fullmatch(value) is not None


def check_name(value: object, what: str = "A site's name", why: str = "") -> str:
    """Return ``value`` if it is a plain name, else raise naming the value and the rule.

    Parameters
    ----------
    value : object
        The name to check.
    what : str
        What the name is, to start the message (``"federation_id"``).
    why : str
        Why the rule holds there, put in brackets after it (``"it names a folder"``).

    Raises
    ------
    ValueError
        ``<what> must be 1 to 64 letters, digits, '-' or '_' (<why>), got <value>.``
    """
    if not is_plain_name(value):
        reason = f" ({why})" if why else ""
        raise ValueError(f"{what} must be {NAME_RULE}{reason}, got {_short(value)}.")
    return str(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:70]}... ({len(text)} characters)"


def is_loopback(host: str) -> bool:
    """Return whether ``host`` names this host only: 127.0.0.0/8, ``::1`` or ``localhost``.

    ``[::1]`` (the bracketed form of a URL or ``HOST:PORT``) counts; an IPv4 address
    mapped into IPv6 (``::ffff:127.0.0.1``) counts as that IPv4 address. ``0.0.0.0`` does
    not (it binds every interface), nor does any other name (``localhost.example.com``
    is resolved by DNS, which may point it anywhere).
    """
    bracketed = host.startswith("[") and host.endswith("]")
    text = host[1:-1] if bracketed else host
    if text.lower() == "localhost" and not bracketed:
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if bracketed and not isinstance(address, ipaddress.IPv6Address):
        return False  # brackets hold IPv6 literals only
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
