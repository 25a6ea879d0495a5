"""TLS contexts for the peer transport (mutual TLS when both sides hold certificates).

Peers are named by IP:port, so the server certificate is checked against the CA
but not against a host name; the overlay's own signatures authenticate peers'
roles, TLS protects the links' confidentiality and integrity.
"""

from __future__ import annotations

import ssl


def server_context(cert: str, key: str, ca: str | None = None) -> ssl.SSLContext:
    """A listening peer's context; with ``ca`` it also requires a client certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if ca:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: str, cert: str | None = None, key: str | None = None
                   ) -> ssl.SSLContext:
    """A dialing peer's context: verifies the server against ``ca``, presents ``cert``."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    if cert:
        context.load_cert_chain(cert, key)
    return context
