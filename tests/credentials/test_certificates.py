"""Key-server signatures over schemas and root transport keys bind every field."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials.certificates import (
    RootCertificate,
    root_certificate_message,
    verify_schema,
)
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.server_keys import Ed25519Server


def test_root_certificates_bind_every_field():
    server = Ed25519PrivateKey.generate()
    server_key = Ed25519Server(server.public_key().public_bytes_raw())
    transport = b"\x07" * 32
    cert = RootCertificate.issue(server, "price", transport, 5, 2000)
    assert cert.verify(server_key, "price", now=1999)
    assert not cert.verify(server_key, "price", now=2001)
    assert not cert.verify(server_key, "volume")
    other = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    assert not cert.verify(Ed25519Server(other))
    for changed in (dict(attribute="volume"), dict(transport_key=b"\x08" * 32), dict(epoch=6),
                    dict(expires_at=2001), dict(transport_key=b"\x07" * 31)):
        assert not RootCertificate(**{**cert.__dict__, **changed}).verify(server_key)
    assert RootCertificate.from_bytes(cert.to_bytes()) == cert
    for junk in (b"", b"\x93\x01\x02\x03", cert.to_bytes()[:-1]):
        with pytest.raises(ValueError):
            RootCertificate.from_bytes(junk)
    # field boundaries are unambiguous, and a certificate is no schema signature
    assert root_certificate_message("ab", transport, 1, 1) != \
        root_certificate_message("a", transport, 1, 1)
    assert not verify_schema(server_key, default_schema(), cert.signature)
