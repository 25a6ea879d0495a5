"""Throwaway certificates for the TLS tests: a self-signed one for 127.0.0.1 (the key
server's HTTPS), a peer-link CA minting peers' credentials as the key server does, and a
threshold deployment's peer-link certificates as its members and clients make them."""

from __future__ import annotations

import datetime
import ipaddress
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.certificates import peer_link_message
from ibe_pubsub.credentials.peer_certificates import (
    PeerBinding,
    ca_certificate,
    handshake_ca_certificate,
    handshake_ca_key,
    issue_peer_certificate,
    to_pem,
)
from ibe_pubsub.evaluation.threshold_lab import local_deployment
from ibe_pubsub.peer.tls import PeerTLS


def self_signed(directory: Path) -> tuple[str, str]:
    """Write cert.pem and key.pem (valid for an hour, SAN 127.0.0.1); return their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


class PeerCA:
    """A peer-link CA of its own key (two instances are foreign to each other), issuing
    certificates with :func:`credentials.peer_certificates.issue_peer_certificate`."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.pem = to_pem(ca_certificate(self.key))

    def certificate(self, key: Ed25519PrivateKey, addresses: Sequence[str] = (), *,
                    identity: str = "peer", role: str = "subscriber",
                    lifetime: float = 3600.0, issued: float | None = None) -> str:
        """A PEM certificate for ``key`` valid from ``issued`` (default now) for
        ``lifetime`` seconds."""
        issued = time.time() if issued is None else issued
        binding = PeerBinding(identity, role, tuple(addresses), (), 1)
        return to_pem(issue_peer_certificate(self.key, key.public_key(), binding, issued,
                                             issued + lifetime))

    def credentials(self, addresses: Sequence[str] = (), *, key: Ed25519PrivateKey | None = None,
                    identity: str = "peer", lifetime: float = 3600.0,
                    issued: float | None = None) -> PeerTLS:
        """:class:`PeerTLS` for ``key`` (a new one by default) under this CA."""
        key = key or Ed25519PrivateKey.generate()
        return PeerTLS(key, self.certificate(key, addresses, identity=identity,
                                             lifetime=lifetime, issued=issued), self.pem)


class ThresholdLinks:
    """A threshold deployment's peer-link certificates, made as a client makes them from
    its members' answers (``ThresholdKeyClient.certify_link_key``): a quorum of members each
    sign the link key, binding and expiry with their own Ed25519 member key (tag 24), in a
    certificate of the deployment's public handshake CA. ``credentials`` fits
    :func:`peer_links.secure_peer`."""

    def __init__(self, deployment: bytes = b"peer-links", t: int = 3, n: int = 5,
                 member_keys: dict[int, Ed25519PrivateKey] | None = None) -> None:
        self.group = load_group()
        self.tpk, self.secrets = local_deployment(self.group, t, n, deployment)
        self.member_keys = member_keys or {i: Ed25519PrivateKey.generate()
                                           for i in range(1, n + 1)}
        self.quorum = T.link_quorum(t, n)
        self.links = T.QuorumSigners({i: k.public_key().public_bytes_raw()
                                      for i, k in self.member_keys.items()}, self.quorum,
                                     T.deployment_scope(self.tpk))
        self.ca_key = handshake_ca_key(bytes(self.tpk.X))
        self.pem = to_pem(handshake_ca_certificate(bytes(self.tpk.X)))

    def signatures(self, link_key: bytes, binding: PeerBinding, not_after: int,
                   servers: Sequence[int] | None = None) -> dict[int, bytes]:
        """Each of ``servers``' (by default the first quorum's) signature, by index."""
        message = self.links.scope + peer_link_message(link_key, binding.to_bytes(), not_after)
        return {i: self.member_keys[i].sign(message)
                for i in servers or range(1, self.quorum + 1)}

    def sign(self, link_key: bytes, binding: PeerBinding, not_after: int,
             servers: Sequence[int] | None = None) -> bytes:
        """What ``servers`` (by default the first quorum) sign, as a quorum signature."""
        return T.encode_quorum_signature(self.signatures(link_key, binding, not_after,
                                                         servers))

    def certificate(self, key: Ed25519PrivateKey, addresses: Sequence[str] = (), *,
                    identity: str = "peer", role: str = "subscriber",
                    lifetime: float = 3600.0, signature: bytes | None = None) -> str:
        """A PEM certificate for ``key``, with the deployment's signature of its binding
        unless ``signature`` is given."""
        now = time.time()
        binding = PeerBinding(identity, role, tuple(addresses), (), 1)
        not_after = int(now + lifetime)
        if signature is None:
            signature = self.sign(key.public_key().public_bytes_raw(), binding, not_after)
        return to_pem(issue_peer_certificate(self.ca_key, key.public_key(), binding, now,
                                             not_after, link_signature=signature))

    def credentials(self, addresses: Sequence[str] = (), *, key: Ed25519PrivateKey | None = None,
                    identity: str = "peer", lifetime: float = 3600.0) -> PeerTLS:
        """:class:`PeerTLS` of a peer of this deployment, which takes only its certificates."""
        key = key or Ed25519PrivateKey.generate()
        return PeerTLS(key, self.certificate(key, addresses, identity=identity,
                                             lifetime=lifetime), self.pem, links=self.links)
