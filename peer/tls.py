"""Mutual TLS 1.3 for peer links, under the key server's peer-link CA.

Every peer holds an Ed25519 transport key and a certificate from the peer-link CA
(:mod:`credentials.peer_certificates`) naming the address(es) it listens on. Both sides of
every link present their certificate and require the other's (``CERT_REQUIRED`` on the
server too). Host names are not checked (``check_hostname=False``): peers are named
``host:port``, which X.509 name checks do not cover, so the transport compares the address
it dialed, or the address a dialer claims, with the addresses the certificate binds.

On a threshold deployment the CA is the deployment's public handshake CA and ``links`` is
the deployment (``credentials.threshold.QuorumSigners``): a certificate counts only with
a quorum of members' signature of its key, binding and expiry, checked on both sides right after
the handshake, before any frame (:mod:`credentials.peer_certificates` says why that is
worth version 2's CA).
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    PeerCertificate,
    PeerCertificateError,
    ServerVerifier,
    is_handshake_ca,
    read_peer_certificate,
    read_peer_certificate_der,
)


class PeerTLS:
    """A peer's TLS credentials: a server and a client context sharing one key, one
    certificate and the CA, and on a threshold deployment its ``QuorumSigners``
    (``links``): every certificate then needs ``link_quorum(t, n)`` members' own
    signatures of its key, binding and expiry. :meth:`install` swaps in a renewed certificate for
    the same key; connections already open keep the certificate they were made with."""

    def __init__(self, key: Ed25519PrivateKey, certificate_pem: str, ca_pem: str,
                 links: ServerVerifier | None = None) -> None:
        if links is None and is_handshake_ca(ca_pem):
            raise PeerCertificateError(
                "the CA is a threshold deployment's public handshake CA, under which anyone "
                "can issue: its peer links need the members' signature check (links)")
        self._key = key
        self.links = links
        #: For accepted connections (it requires the dialer's certificate).
        self.server_context = _context(ssl.PROTOCOL_TLS_SERVER, ca_pem)
        #: For dialed connections.
        self.client_context = _context(ssl.PROTOCOL_TLS_CLIENT, ca_pem)
        self._certificate = self._load(certificate_pem)

    @property
    def certificate(self) -> PeerCertificate:
        """The binding and expiry of the certificate new handshakes present."""
        return self._certificate

    def install(self, certificate_pem: str) -> None:
        """Present ``certificate_pem`` (for this peer's key) on every new handshake.
        Raises :class:`PeerCertificateError` for a certificate of another key or without a
        peer binding."""
        self._certificate = self._load(certificate_pem)

    def _load(self, certificate_pem: str) -> PeerCertificate:
        try:
            cert = x509.load_pem_x509_certificate(certificate_pem.encode("ascii"))
        except (ValueError, UnicodeEncodeError) as exc:
            raise PeerCertificateError(f"not a PEM certificate: {exc}") from None
        if cert.public_key() != self._key.public_key():
            raise PeerCertificateError("the certificate is for another transport key")
        certificate = read_peer_certificate(cert, self.links)
        _load_chain((self.server_context, self.client_context), self._key, certificate_pem)
        return certificate

    def remote_certificate(self, ssl_object: ssl.SSLObject | None) -> PeerCertificate:
        """The other side's certificate on a connection whose handshake has completed.
        Raises :class:`PeerCertificateError` if there is none, it binds no peer, or (on a
        threshold deployment) the deployment did not sign it."""
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            raise PeerCertificateError("the peer presented no certificate")
        return read_peer_certificate_der(der, self.links)


def _context(protocol: int, ca_pem: str) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # before CERT_REQUIRED: the client context demands it
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=ca_pem)
    return context


def _load_chain(contexts: tuple[ssl.SSLContext, ...], key: Ed25519PrivateKey,
                certificate_pem: str) -> None:
    """Load the key and certificate into ``contexts``.

    Python's ssl only loads a certificate chain from files. The key is written encrypted
    under a one-time random password that never leaves memory, to a 0600 file in a 0700
    directory of its own, which is deleted as soon as OpenSSL has read it: what touches the
    disk, briefly, is a ciphertext whose password is gone with this call.
    """
    password = secrets.token_bytes(32)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.BestAvailableEncryption(password))
    with tempfile.TemporaryDirectory(prefix="peer-tls-") as directory:
        key_file, cert_file = Path(directory, "key.pem"), Path(directory, "cert.pem")
        for path, data in ((key_file, key_pem), (cert_file, certificate_pem.encode("ascii"))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
        for context in contexts:
            context.load_cert_chain(cert_file, key_file, password=password)
