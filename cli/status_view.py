"""``ibe-pubsub peer status URL``: a peer's ``/status``, fetched and printed one line per tree."""

from __future__ import annotations

import datetime
from typing import Any

import httpx

from ibe_pubsub.cli.exceptions import CliError
from ibe_pubsub.credentials import escape

TIMEOUT = 5.0


class StatusError(CliError):
    """The URL cannot be reached or is not a peer's status endpoint."""


def status_url(url: str) -> str:
    """The /status URL of an endpoint given as ``HOST:PORT`` or any URL on it (its scheme,
    host and port are kept, its path replaced)."""
    if "://" not in url:
        url = "http://" + url
    parsed = httpx.URL(url)
    return str(parsed.copy_with(path="/status", query=None, fragment=None))


def fetch_status(url: str) -> dict[str, Any]:
    """GET the ``/status`` of the endpoint ``url`` names and check its shape."""
    try:
        target = status_url(url)
        response = httpx.get(target, timeout=TIMEOUT)
    except httpx.InvalidURL as exc:
        raise StatusError(f"not a URL: {url!r} ({exc})") from exc
    except httpx.UnsupportedProtocol:
        raise StatusError(f"not an http:// URL: {url!r}") from None
    except httpx.HTTPError as exc:
        raise StatusError(f"cannot reach {target}: {exc or type(exc).__name__}") from exc
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if (response.status_code != 200 or not isinstance(doc, dict)
            or not isinstance(doc.get("trees"), dict) or "address" not in doc):
        raise StatusError(f"{target} is not a peer's status endpoint (HTTP "
                          f"{response.status_code}); give the URL of a peer's --http")
    return doc


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%SZ")


def _ends(ends: list[dict[str, str]]) -> str:
    return ",".join(e["address"] for e in ends) or "-"


def tree_line(attribute: str, tree: dict[str, Any]) -> str:
    vps = []
    for vp in tree["virtual_peers"]:
        kind = "root" if vp["root"] else "relay" if vp["relay"] else "vp"
        depth = "?" if vp["depth"] is None else vp["depth"]
        vps.append(f"{kind} {vp['vp'] or '-'} pos {vp['position']} depth {depth} "
                   f"parents {_ends(vp['parents'])} children {_ends(vp['children'])}")
    return (f"tree {attribute}: {len(tree['virtual_peers'])} virtual peer(s), "
            f"{tree['links']} link(s), {tree['relays']} relay(s); " + "; ".join(vps))


def status_lines(status: dict[str, Any]) -> list[str]:
    """A header line (who, epoch, readiness), then one line per tree, control characters
    escaped."""
    joined = status.get("join_seconds")
    state = "ready" if status.get("ready") else "joining"
    if status.get("ready") and joined is not None:
        state += f" (joined in {joined:.2f} s)"
    header = (f"peer {status['address']}: identity {status.get('identity') or '-'}, role "
              f"{status.get('role') or '-'}, epoch {status.get('epoch')}, keys until "
              f"{_when(status.get('key_expiry'))}, {state}")
    lines = [header] + [tree_line(a, t) for a, t in sorted(status["trees"].items())]
    return [escape(line) for line in lines]  # the text comes from the network
