"""Health probe of the key server running beside it, for container HEALTHCHECKs.

``python -I -m keyserver.healthcheck`` exits 0 if ``GET /healthz`` answers 200, else 1 with
the reason on one line. It finds the server as ``keyserver serve`` does, from the
``IBE_PUBSUB_HOST``, ``IBE_PUBSUB_PORT`` and ``IBE_PUBSUB_TLS_CERT`` environment variables
(flags given to ``serve`` on its command line are not seen), and speaks HTTPS when a
certificate is set. It skips verifying that certificate: the probe sends no secret, and the
certificate names the server's public host name, not the address probed. A container whose
processes include no ``keyserver serve`` (a peer, a bulk job, a one-off admin command) has
nothing to probe and counts as healthy. Standard library only, so it starts fast.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

WILDCARDS = ("", "0.0.0.0", "::", "[::]")
TIMEOUT = 5.0


def probe_url(environ: dict[str, str]) -> str:
    """The /healthz URL of the server configured by ``environ``; wildcards probe loopback."""
    host = environ.get("IBE_PUBSUB_HOST", "127.0.0.1").strip()
    host = "127.0.0.1" if host in WILDCARDS else host.strip("[]")
    port = environ.get("IBE_PUBSUB_PORT", "").strip() or "8700"
    scheme = "https" if environ.get("IBE_PUBSUB_TLS_CERT") else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/healthz"


def runs_keyserver(command_lines: Iterable[Sequence[str]]) -> bool:
    """Whether one of these command lines is ``... keyserver ... serve ...``."""
    for args in command_lines:
        if "keyserver" in args and "serve" in args[args.index("keyserver"):]:
            return True
    return False


def _command_lines() -> Iterable[list[str]]:
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            yield entry.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process ended meanwhile
            continue


def check(url: str) -> str | None:
    """None if ``url`` answers 200, else why not."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT, context=context) as answer:
            status = answer.status
    except OSError as exc:  # URLError, HTTPError, timeouts and refused connections
        return f"{url}: {getattr(exc, 'reason', None) or exc}"
    return None if status == 200 else f"{url}: status {status}"


def main() -> int:
    if not runs_keyserver(_command_lines()):
        return 0
    problem = check(probe_url(dict(os.environ)))
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
