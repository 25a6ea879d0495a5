"""X.509 certificates for peer links: the key server is a private CA for transport keys.

Every peer (subscriber, root, publisher) holds an Ed25519 transport key. At enrolment
the key server certifies it with a short-lived X.509 certificate whose extension
:data:`PEER_EXTENSION` binds

* the identity's name and role,
* the ``host:port`` address(es) the peer listens on (none for a publisher),
* for a root, the attribute trees its policy lets it root,
* the epoch, with the certificate expiring at that epoch's end plus the grace period.

Peer links then run mutually authenticated TLS 1.3 under the CA, and a peer's
address in the overlay is one its certificate names, never what it claims. The CA
certificate is deterministic (fixed dates, a serial derived from the key, Ed25519's
deterministic signatures), so key-server replicas sharing a key store serve the same
bytes; the key server also signs it with its Ed25519 key (``certificates.
transport_ca_message``) so peers take it from the public parameters they already
check. The extension is not critical: TLS libraries verify the chain and dates, and
this module reads the bindings.

A threshold deployment (version 3) has no CA key: no member may hold one. There a quorum
of ``ceil((n + t) / 2)`` members (``threshold.link_quorum``; more than ``t``, so that any
two certificates share an honest member, which certifies an address to one identity only)
sign the link key, the binding and the expiry together
(``certificates.peer_link_message``), and the signature travels in a second extension,
:data:`LINK_SIGNATURE_EXTENSION`, of a certificate issued by the deployment's *handshake
CA*, whose key every peer, and anyone else, derives from the deployment's public signing
key (:func:`handshake_ca_key`). That CA vouches for nothing; it lets TLS run, since
Python's ssl verifies every certificate it requests. What vouches for the link is read
after the handshake: :func:`read_peer_certificate` with the deployment as ``links`` takes
a certificate only with such a signature over its own public key, binding and expiry
(``threshold.QuorumSigners``), before it parses the binding. With TLS 1.3 proving that
the other side holds the certificate's private key, that is what version 2's CA signature
gives: the key service vouched for this key, with this binding, until then.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID, ObjectIdentifier

from ibe_pubsub.credentials.certificates import peer_link_message
from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.server_keys import ServerVerifier

#: A UUID-based OID (ITU-T X.667, arc 2.25) naming this project's peer-binding extension.
PEER_EXTENSION = ObjectIdentifier("2.25.113840910988005767357125380419690456792")
EXTENSION_VERSION = 1
#: The extension holding a threshold deployment's signature of the link (version 3).
LINK_SIGNATURE_EXTENSION = ObjectIdentifier("2.25.71483995365589669488560753349689420978")
HANDSHAKE_CA_TAG = b"ibe-pubsub/v3/peer-link-handshake-ca"
CA_NAME = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ibe-pubsub"),
                     x509.NameAttribute(NameOID.COMMON_NAME, "ibe-pubsub peer-link CA")])
#: A threshold deployment's handshake CA, named apart so that nothing takes it for a CA
#: that vouches (``PeerTLS`` refuses it without the deployment's signature check).
HANDSHAKE_CA_NAME = x509.Name([
    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ibe-pubsub"),
    x509.NameAttribute(NameOID.COMMON_NAME, "ibe-pubsub handshake CA (vouches for nothing)")])
PEER_NAME = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ibe-pubsub"),
                       x509.NameAttribute(NameOID.COMMON_NAME, "ibe-pubsub peer")])
ROLES = ("subscriber", "root", "publisher")
MAX_ADDRESSES = 4
#: Certificates are valid from a minute before issuance, for clocks slightly behind.
CLOCK_SKEW = 60.0
_CA_NOT_BEFORE = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
_CA_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                       r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")
#: A last label that resolvers read as a number ("127.1", "0x7f.1", "2130706433"): such a
#: name is another spelling of an IP address, so it is refused rather than certified twice.
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")


class PeerCertificateError(CredentialsError, ValueError):
    """A certificate that is not a peer certificate of this project, or an address that
    cannot be certified."""


def is_unspecified(host: str) -> bool:
    """Whether ``host`` (an IPv6 one in brackets or not) is 0.0.0.0 or ::, which a listener
    takes for every interface but no peer can dial."""
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def canonical_address(address: str) -> str:
    """``host:port`` in the one spelling that is certified and compared: a unicast IP literal
    other than 0.0.0.0 and :: (IPv4-mapped and scoped IPv6 refused, as second spellings of
    one endpoint) in its compressed form (IPv6 in brackets) or a lower-case DNS name
    whose last label is not a number, and a port in 1..65535. Raises
    :class:`PeerCertificateError` for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or len(port) > 5 or not 0 < int(port) < 65536:
        raise PeerCertificateError(f"not a HOST:PORT address with a port in 1..65535: "
                                   f"{address!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        name = host.lower()
        if bracketed or not _HOSTNAME.match(name):
            raise PeerCertificateError(f"not an IP address or host name: {host!r}") from None
        if _NUMERIC_LABEL.match(name.rsplit(".", 1)[-1]):
            raise PeerCertificateError(f"{host!r} is a numeric spelling of an address, not a "
                                       "host name: write the IP address as a.b.c.d") from None
        return f"{name}:{int(port)}"
    if ip.version == 6 and not bracketed:
        raise PeerCertificateError(f"an IPv6 host goes in brackets: {address!r}")
    if is_unspecified(host):
        raise PeerCertificateError(f"{host} is the unspecified address (every interface, to a "
                                   "listener), which no peer can dial")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # A second spelling of an IPv4 endpoint would let two identities own one address.
        raise PeerCertificateError(f"{host} is an IPv4-mapped IPv6 address: write the IPv4 "
                                   f"address {ip.ipv4_mapped} instead")
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        raise PeerCertificateError(f"{host} carries a zone (%...), which names an interface "
                                   "of one machine only: use an address without one")
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise PeerCertificateError(f"{host} is a multicast or broadcast address, not a peer's")
    return f"[{ip.compressed}]:{int(port)}" if ip.version == 6 else f"{ip}:{int(port)}"


@dataclass(frozen=True)
class PeerBinding:
    """What a peer certificate says about its holder."""

    identity: str
    role: str
    addresses: tuple[str, ...]
    attributes: tuple[str, ...]
    epoch: int

    def to_bytes(self) -> bytes:
        """The extension's value: canonical JSON."""
        return json.dumps({"v": EXTENSION_VERSION, "identity": self.identity, "role": self.role,
                           "addresses": list(self.addresses),
                           "attributes": list(self.attributes), "epoch": self.epoch},
                          sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> PeerBinding:
        try:
            doc = json.loads(data.decode("utf-8"))
            if doc.pop("v") != EXTENSION_VERSION:
                raise PeerCertificateError("peer binding of another version")
            binding = cls(identity=doc["identity"], role=doc["role"],
                          addresses=tuple(doc["addresses"]),
                          attributes=tuple(doc["attributes"]), epoch=doc["epoch"])
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PeerCertificateError(f"malformed peer binding: {exc}") from None
        if not (isinstance(binding.identity, str) and binding.role in ROLES
                and all(isinstance(a, str) for a in binding.addresses + binding.attributes)
                and isinstance(binding.epoch, int) and not isinstance(binding.epoch, bool)):
            raise PeerCertificateError("malformed peer binding")
        return binding


@dataclass(frozen=True)
class PeerCertificate:
    """A verified peer's binding and the end of its certificate's validity (Unix time)."""

    binding: PeerBinding
    not_after: float

    def names(self, address: str) -> bool:
        return address in self.binding.addresses


def ca_key_from_seed(seed: bytes) -> Ed25519PrivateKey:
    """The CA key, derived by the key server from its master secret (32 bytes)."""
    return Ed25519PrivateKey.from_private_bytes(seed)


def handshake_ca_key(deployment_key: bytes) -> Ed25519PrivateKey:
    """A threshold deployment's handshake CA key, ``SHA-256(tag || X)``: public on purpose
    (see the module's docstring), the same for every peer of the deployment."""
    return Ed25519PrivateKey.from_private_bytes(
        hashlib.sha256(HANDSHAKE_CA_TAG + deployment_key).digest())


def handshake_ca_certificate(deployment_key: bytes) -> x509.Certificate:
    """The handshake CA's certificate (see :func:`handshake_ca_key`)."""
    return ca_certificate(handshake_ca_key(deployment_key), HANDSHAKE_CA_NAME)


def is_handshake_ca(ca_pem: str) -> bool:
    """Whether ``ca_pem`` holds a threshold deployment's handshake CA (alone or among
    others), which vouches for nothing by itself."""
    try:
        cas = x509.load_pem_x509_certificates(ca_pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        return False
    return any(ca.subject == HANDSHAKE_CA_NAME for ca in cas)


def ca_certificate(ca_key: Ed25519PrivateKey, name: x509.Name = CA_NAME) -> x509.Certificate:
    """The self-signed CA certificate; the same bytes for the same key, every time."""
    public = ca_key.public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    serial = int.from_bytes(hashlib.sha256(raw).digest()[:16], "big") >> 1
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(public).serial_number(serial)
            .not_valid_before(_CA_NOT_BEFORE).not_valid_after(_CA_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(ca_key, None))


def issue_peer_certificate(ca_key: Ed25519PrivateKey, public_key: Ed25519PublicKey,
                           binding: PeerBinding, now: float, not_after: float,
                           link_signature: bytes | None = None) -> x509.Certificate:
    """Certify ``public_key`` for ``binding`` from ``now`` (less the clock skew) until
    ``not_after``; with a threshold deployment's ``link_signature`` of them (and
    ``not_after`` a whole second), under its handshake CA."""
    start = datetime.datetime.fromtimestamp(now - CLOCK_SKEW, datetime.UTC)
    end = datetime.datetime.fromtimestamp(not_after, datetime.UTC)
    builder = x509.CertificateBuilder()
    if link_signature is not None:
        builder = builder.add_extension(
            x509.UnrecognizedExtension(LINK_SIGNATURE_EXTENSION, link_signature),
            critical=False)
    issuer = CA_NAME if link_signature is None else HANDSHAKE_CA_NAME
    return (builder.subject_name(PEER_NAME).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.UnrecognizedExtension(PEER_EXTENSION, binding.to_bytes()),
                           critical=False)
            .sign(ca_key, None))


def _extension(cert: x509.Certificate, oid: ObjectIdentifier, what: str) -> bytes:
    try:
        value = cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        raise PeerCertificateError(f"the certificate carries no {what}") from None
    except (ValueError, x509.DuplicateExtension) as exc:  # anyone may mint certificates
        raise PeerCertificateError(f"the certificate's extensions do not decode: {exc}"
                                   ) from None                 # under a handshake CA
    if not isinstance(value, x509.UnrecognizedExtension):
        raise PeerCertificateError(f"the certificate's {what} does not decode")
    return value.value


def _check_link_signature(cert: x509.Certificate, binding: bytes, not_after: float,
                          links: ServerVerifier) -> None:
    """Refuse a certificate unless ``links`` signed its key, ``binding`` and expiry."""
    signature = _extension(cert, LINK_SIGNATURE_EXTENSION,
                           "signature of the key service (a version-2 certificate?)")
    try:
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PeerCertificateError(f"the certificate's key does not decode: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise PeerCertificateError("the certificate's key is not an Ed25519 link key")
    if not links.verify(peer_link_message(key.public_bytes_raw(), binding, int(not_after)),
                        signature):
        raise PeerCertificateError("the key service's signature of the link key, binding "
                                   "and expiry does not verify")


def read_peer_certificate(cert: x509.Certificate, links: ServerVerifier | None = None
                          ) -> PeerCertificate:
    """The binding of a certificate whose chain and dates TLS has already verified; with
    ``links`` (a threshold deployment), only once its signature of the certificate's key,
    binding and expiry verifies."""
    binding = _extension(cert, PEER_EXTENSION, "peer binding")
    not_after = cert.not_valid_after_utc.timestamp()
    if links is not None:
        _check_link_signature(cert, binding, not_after, links)
    return PeerCertificate(PeerBinding.from_bytes(binding), not_after)


def read_peer_certificate_der(der: bytes, links: ServerVerifier | None = None
                              ) -> PeerCertificate:
    """:func:`read_peer_certificate` of what a TLS handshake gave; whatever in it does not
    decode (under a handshake CA anyone may mint one) is a :class:`PeerCertificateError`."""
    try:
        return read_peer_certificate(x509.load_der_x509_certificate(der), links)
    except PeerCertificateError:
        raise
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PeerCertificateError(f"the certificate does not decode: {exc}") from None


def to_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
