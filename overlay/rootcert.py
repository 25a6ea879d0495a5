"""Root certificates: the key server's Ed25519 signature over a root peer's transport key.

A root peer holds the whole-domain credential of one attribute but no D/S1/S2
(SCHEME.md), so it cannot prove acceptance with an SW. It signs the acceptance
context with its transport key instead, and the newcomer checks the key
server's certificate over that key. The signed bytes are
:func:`root_certificate_message`; the certificate travels as a msgpack array
``[attribute, transport_key, epoch, expires_at, signature]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DOMAIN = b"ibe-pubsub/v1/root-certificate"


def _length_prefixed(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def root_certificate_message(attribute: str, transport_key: bytes, epoch: int,
                             expires_at: int) -> bytes:
    """The exact bytes the key server signs to certify a root's transport key."""
    return _length_prefixed(DOMAIN, attribute.encode(), transport_key,
                            epoch.to_bytes(8, "big"), expires_at.to_bytes(8, "big"))


@dataclass(frozen=True)
class RootCertificate:
    attribute: str
    transport_key: bytes
    epoch: int
    expires_at: int
    signature: bytes

    def to_bytes(self) -> bytes:
        return msgpack.packb([self.attribute, self.transport_key, self.epoch, self.expires_at,
                              self.signature], use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> RootCertificate:
        try:
            a, k, e, x, s = msgpack.unpackb(data, raw=False)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
            raise ValueError(f"malformed root certificate: {exc}") from None
        if not (isinstance(a, str) and isinstance(k, bytes) and isinstance(e, int)
                and isinstance(x, int) and isinstance(s, bytes)):
            raise ValueError("malformed root certificate fields")
        return cls(a, k, e, x, s)

    def check(self, server_key: Ed25519PublicKey, attribute: str, now: float) -> bool:
        """True iff the key server signed it, for ``attribute``, and it has not expired."""
        if self.attribute != attribute or self.expires_at < now:
            return False
        try:
            server_key.verify(self.signature, root_certificate_message(
                self.attribute, self.transport_key, self.epoch, self.expires_at))
        except InvalidSignature:
            return False
        return True


def issue_root_certificate(server_key: Ed25519PrivateKey, attribute: str, transport_key: bytes,
                           epoch: int, expires_at: int) -> RootCertificate:
    """What the key server does to certify a root (here for local issuers and tests)."""
    signature = server_key.sign(root_certificate_message(attribute, transport_key, epoch,
                                                         expires_at))
    return RootCertificate(attribute, transport_key, epoch, expires_at, signature)
