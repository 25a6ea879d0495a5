"""Limits on connections, enforced before the request gate (``keyserver/middleware.py``)
can see anything: that gate runs once a request head is complete, so a client sending heads
slowly (slow-loris) or never would otherwise hold its connections, and their file
descriptors, forever. About a thousand such connections would exhaust the usual limit of
1,024 open files and the server would refuse everyone.

:class:`ConnectionLimits` holds the settings: the time a connection may take to send a
complete request head (from its opening, TLS handshake included, or the end of the previous
answer, so it bounds idle keep-alive time too), and caps on open connections, in total and
per client address, counted from the TCP connection's acceptance.
:class:`ConnectionGate` keeps the counts. Both are plain Python, checked before unsealing;
the HTTP protocol applying them (``keyserver.announcing``) loads with the web stack.
"""

from __future__ import annotations

import ipaddress
import math
import resource
from collections import Counter
from dataclasses import dataclass, field, replace

from ibe_pubsub.keyserver.exceptions import ServerSettingsError

#: Open files kept out of the connection cap at the least: the database, its journal,
#: the issuer processes' pipes, logs, the listening sockets.
FD_RESERVE = 128
#: The derived cap never exceeds this, so memory stays bounded as well: each connection
#: may buffer up to 32 KiB of unfinished head.
DEFAULT_MAX_CONNECTIONS = 4096
#: IPv6 clients are counted per /64, what one subscriber line usually gets.
IPV6_PREFIX = 64


@dataclass(frozen=True)
class ConnectionLimits:
    """``head_timeout`` seconds for a complete request head (over TLS, the handshake
    included); at most ``max_connections`` open at once (None: derived from the open-file
    limit) and ``max_per_address`` per client address. 0 turns a limit off, e.g. behind a
    proxy enforcing its own."""

    head_timeout: float = 10.0
    max_connections: int | None = None
    max_per_address: int = 64

    def __post_init__(self) -> None:
        if not 0 <= self.head_timeout < math.inf:
            raise ServerSettingsError(f"--header-timeout must be a number of seconds, at "
                                      f"least 0, got {self.head_timeout}")
        for flag, value in (("--max-connections", self.max_connections),
                            ("--max-connections-per-address", self.max_per_address)):
            if value is not None and value < 0:
                raise ServerSettingsError(f"{flag} must not be negative, got {value}")

    def resolved(self, open_files: int | None = None) -> ConnectionLimits:
        """These limits with ``max_connections`` derived from ``open_files`` (default: this
        process's soft RLIMIT_NOFILE), leaving a quarter and at least FD_RESERVE for the
        rest; a cap the limit cannot hold is refused, as a server reaching it would stop
        accepting anyone rather than refusing the surplus."""
        if open_files is None:
            open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if open_files == resource.RLIM_INFINITY:
            return replace(self, max_connections=self.max_connections
                           if self.max_connections is not None else DEFAULT_MAX_CONNECTIONS)
        room = open_files - FD_RESERVE
        if self.max_connections is None:
            derived = min(DEFAULT_MAX_CONNECTIONS, open_files - max(FD_RESERVE, open_files // 4))
            if derived < 1:
                raise ServerSettingsError(
                    f"the open-file limit ({open_files}) leaves no room for connections: "
                    f"raise it above {FD_RESERVE} (ulimit -n)")
            return replace(self, max_connections=derived)
        if self.max_connections > room:
            raise ServerSettingsError(
                f"--max-connections {self.max_connections} needs more open files than the "
                f"limit of {open_files} allows (at most {max(room, 0)}, keeping {FD_RESERVE} "
                "for the database and workers): raise the limit (ulimit -n) or lower it")
        return self


def address_key(host: str) -> str:
    """The unit the per-address cap counts: the IPv4 address (also IPv4-mapped), the /64 of
    an IPv6 address, or the text itself (a Unix socket's path)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is None:
            return str(ipaddress.IPv6Network((address, IPV6_PREFIX), strict=False))
        address = address.ipv4_mapped
    return str(address)


@dataclass
class ConnectionGate:
    """The open connections of one server, in total and per address key, against
    ``limits`` (resolved); and how many were refused or timed out, for the log."""

    limits: ConnectionLimits
    total: int = 0
    per_address: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    timed_out: int = 0

    def admit(self, key: str) -> str | None:
        """Count a new connection from ``key`` and return None, or say why it is refused
        (and count nothing)."""
        cap, per_address = self.limits.max_connections, self.limits.max_per_address
        if cap and self.total >= cap:
            reason = f"the server holds its maximum of {cap} connections"
        elif per_address and self.per_address[key] >= per_address:
            reason = f"{per_address} connections from one address at most"
        else:
            self.total += 1
            self.per_address[key] += 1
            return None
        self.refused += 1
        return reason

    def release(self, key: str) -> None:
        """Forget a connection :meth:`admit` counted."""
        self.total -= 1
        self.per_address[key] -= 1
        if not self.per_address[key]:
            del self.per_address[key]
