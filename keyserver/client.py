"""HTTP client of the key server, used by peers, the CLI and the bulk tools.

Retries (with exponential back-off) only on connection errors and 5xx answers; every
4xx raises :class:`KeyServerRequestError` at once with the server's error body. The
``*_bundle`` helpers in :mod:`keyserver.bundles` turn responses into library objects.
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from ibe_pubsub.keyserver.exceptions import KeyServerError

RETRY_STATUSES = frozenset({500, 502, 503, 504})


class KeyServerRequestError(KeyServerError):
    """The key server refused a request (4xx) or kept failing (5xx, unreachable)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else body
        problems = error.get("detail") if isinstance(error, dict) else None
        if isinstance(problems, list) and problems and isinstance(problems[0], dict):
            where = ".".join(str(p) for p in problems[0].get("loc", ()))
            message = f"{message} ({where}: {problems[0].get('msg', '')})"
        super().__init__(f"key server answered {status}: {message}" if status else message)
        #: The server refused the connection or answered it is unavailable (502, 503, 504):
        #: it may be starting or restarting, so waiting for it makes sense.
        self.down = status in (502, 503, 504)

    def __reduce__(self) -> tuple[type, tuple[int, Any]]:
        """Pickled with its own arguments, so it crosses a process pool."""
        return type(self), (self.status, self.body)

    @property
    def code(self) -> str | None:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        return error.get("code") if isinstance(error, dict) else None


#: Idle connections are dropped well before a key server closes them (uvicorn: after 5 s,
#: httpx's own default), so that a request never goes out on a connection the server is
#: closing at that moment, which ends it without an answer.
KEEPALIVE_SECONDS = 2.0


class KeyServerClient:
    """One method per endpoint; ``token`` is an identity's or the admin's bearer token."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 0.25,
                 verify: bool | str | ssl.SSLContext = True) -> None:
        """``verify``: True (system CAs), a CA/certificate file to trust, or an SSL context."""
        self.retries, self.backoff = retries, backoff
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                  timeout=timeout, verify=verify,
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    def __enter__(self) -> KeyServerClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """JSON (or text) of a successful answer; retries 5xx and connection errors.

        A ``json`` body is sent ASCII-escaped, so text that is not valid Unicode (a lone
        surrogate from a command-line argument) reaches the server, which refuses it with a
        422 naming the field, instead of failing to encode here."""
        if "json" in kwargs:
            kwargs["content"] = json.dumps(kwargs.pop("json")).encode("ascii")
            kwargs["headers"] = {"content-type": "application/json"} | kwargs.get("headers", {})
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                # retrying cannot change the certificate
                if _certificate_refusal(exc) is not None or last:
                    reason, down = transport_failure(exc)
                    error = KeyServerRequestError(
                        0, f"cannot reach the key server at {self.base_url}: {reason}")
                    error.down = down
                    raise error from exc
            else:
                if response.status_code < 400:
                    if response.headers.get("content-type", "").startswith("application/json"):
                        return response.json()
                    return response.text
                if response.status_code not in RETRY_STATUSES or last:
                    raise KeyServerRequestError(response.status_code, _body(response))
            time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")

    # -- public --
    def params(self) -> dict[str, Any]:
        return self.request("GET", "/v1/params")

    def epoch(self) -> dict[str, Any]:
        return self.request("GET", "/v1/epoch")

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/healthz")

    def metrics(self) -> str:
        return self.request("GET", "/metrics")

    # -- enrolment --
    def whoami(self) -> dict[str, Any]:
        """Name, role and bulk-only flag of the token's identity."""
        return self.request("GET", "/v1/enrol/identity")

    def enrol_subscriber(self, subscription: str, fine_depth: int = 1,
                         max_credentials: int | None = None, epoch: str | None = None
                         ) -> dict[str, Any]:
        return self.request("POST", "/v1/enrol/subscriber", json={
            "subscription": subscription, "fine_depth": fine_depth,
            "max_credentials": max_credentials, "epoch": epoch})

    def enrol_publisher(self, advertisement: str, max_credentials: int | None = None,
                        epoch: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/v1/enrol/publisher", json={
            "advertisement": advertisement, "max_credentials": max_credentials, "epoch": epoch})

    def enrol_root(self, attribute: str, transport_key: str, epoch: str | None = None
                   ) -> dict[str, Any]:
        """``transport_key``: base64 of the raw 32-byte Ed25519 public key."""
        return self.request("POST", "/v1/enrol/root", json={
            "attribute": attribute, "transport_key": transport_key, "epoch": epoch})

    def enrol_transport(self, public_key_b64: str, addresses: Sequence[str],
                        epoch: str | None = None) -> dict[str, Any]:
        """A peer-link certificate of the link key (base64 of the raw 32-byte Ed25519 public
        key) for the ``host:port`` addresses it listens on (canonical form)."""
        return self.request("POST", "/v1/enrol/transport", json={
            "public_key": public_key_b64, "addresses": list(addresses), "epoch": epoch})

    def held_addresses(self) -> list[dict[str, Any]]:
        """This identity's live certified addresses, ``{address, expires_at}``, latest first."""
        return list(self.request("GET", "/v1/enrol/transport")["addresses"])

    # -- admin --
    def create_identity(self, name: str, role: str, policy: str | None = None
                        ) -> dict[str, Any]:
        return self.request("POST", "/v1/admin/identities",
                            json={"name": name, "role": role, "policy": policy})

    def list_identities(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/admin/identities")

    def revoke(self, identity_id: int) -> dict[str, Any]:
        return self.request("POST", f"/v1/admin/identities/{int(identity_id)}/revoke")

    def identity_id(self, name: str) -> int | None:
        """The id of the identity named ``name``, or None if this server has none."""
        match = [row["id"] for row in self.list_identities() if row["name"] == name]
        return match[0] if match else None

    def audit(self, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/admin/audit", params={"after": after, "limit": limit})

    def bulk(self, chunk_id: str, items: list[dict[str, Any]], epoch: str | None = None
             ) -> dict[str, Any]:
        return self.request("POST", "/v1/admin/bulk",
                            json={"chunk_id": chunk_id, "epoch": epoch, "items": items})

    # -- directory --
    def register(self, address: str, attribute: str, role: str, ttl: int,
                 seen: Sequence[str] = ()) -> dict[str, Any]:
        """Lease ``address`` (certified to this identity) in a tree, vouching for the ``seen``
        neighbours there that answered recently."""
        return self.request("POST", "/v1/directory", json={
            "address": address, "attribute": attribute, "role": role, "ttl": ttl,
            "seen": list(seen)})

    def deregister(self, address: str, timeout: float | None = None) -> None:
        """Remove this identity's entries for ``address`` in every tree; ``timeout`` bounds
        each attempt (e.g. a peer shutting down)."""
        extra = {} if timeout is None else {"timeout": timeout}
        self.request("DELETE", f"/v1/directory/{quote(address, safe='')}", **extra)

    def lookup(self, attribute: str, sample: int = 8) -> dict[str, Any]:
        """The tree's roots and up to ``sample`` members, naming nobody; members only for
        the tree's own peers and the admin (none for a publisher), 403 ``not_in_tree`` for
        a subscriber or root outside the tree."""
        return self.request("GET", f"/v1/directory/{attribute}", params={"sample": sample})


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it, outermost first (httpx wraps httpcore wraps the OS error)."""
    cause: BaseException | None = exc
    while cause is not None:
        yield cause
        cause = cause.__cause__ or cause.__context__


#: Errors of a host that is off or cut off (no route to it, its network unreachable).
_HOST_DOWN = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})


def transport_failure(exc: httpx.TransportError) -> tuple[str, bool]:
    """Why a request got no answer, in a few words, and whether the server is down: it
    refused the connection, reset or closed it without an answer (killed while it
    answered), timed out, or its host cannot be reached, so waiting for it makes sense (a
    peer's --server-wait, a publisher's renewal). A misconfigured URL that closes the same
    way is reported after the wait, with the same message; an untrusted certificate or a
    host name that does not resolve is not down."""
    down = isinstance(exc, httpx.TimeoutException) or any(
        isinstance(c, ConnectionRefusedError | ConnectionResetError | ConnectionAbortedError
                   | httpx.RemoteProtocolError)
        or (isinstance(c, OSError) and c.errno in _HOST_DOWN) for c in _causes(exc))
    return _certificate_refusal(exc) or _unreachable(exc), down


def _certificate_refusal(exc: BaseException) -> str | None:
    """A one-line reason if ``exc`` was caused by the server's certificate not verifying."""
    cause = next((c for c in _causes(exc) if isinstance(c, ssl.SSLCertVerificationError)),
                 None)
    if cause is None:
        return None
    return (f"its TLS certificate is not trusted ({cause.verify_message}); for a private CA "
            "give the CA's certificate as the CA file (--ca-file)")


def _unreachable(exc: httpx.TransportError) -> str:
    """Why no answer came, in a few words, from the innermost error that says it."""
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time (timed out)"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the connection closed without an answer (an https:// server given an " \
            "http:// URL does this)"
    for cause in _causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve its host name ({cause.strerror})"
        if isinstance(cause, ssl.SSLError):
            plain = " (an http:// server given an https:// URL does this)" \
                if cause.reason == "WRONG_VERSION_NUMBER" else ""
            return f"TLS failed: {cause.reason or cause}{plain}"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[:1].lower() + cause.strerror[1:]
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
