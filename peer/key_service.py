"""Where a peer's keys come from: one key server (version 2) or a threshold deployment of
``n`` members of which any ``t`` issue (version 3). The node and the publisher call a
:class:`KeyService` alike; only enrolment differs, never routing, decryption or what a
peer checks (a signature of the one key server, or of ``t`` members under ``X``).

Every call blocks (the node runs them in a worker thread, so that checking and combining
shares, tens of milliseconds of pairings, never holds up its event loop). A refusal or an
outage is a :class:`KeyServerRequestError` either way, ``down`` when waiting may help."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import Predicate, PublicParams
from ibe_pubsub.keyserver import KeyServerClient, ServerParams, TransportCertificate
from ibe_pubsub.overlay import RealCrypto, RootKit, SubscriberKit
from ibe_pubsub.peer import enrolment
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.known_servers import KnownServers
from ibe_pubsub.peer.tls import PeerTLS


class KeyService(Protocol):
    """What a peer asks of its key service; each call blocks."""

    #: Who answers, for messages ("the key server at URL").
    where: str

    def probe(self) -> None:
        """Returns once the service answers; KeyServerRequestError (``down``) while not."""

    def fetch_params(self) -> None:
        """The public parameters, with their signature checked: ``pp`` from then on."""

    @property
    def pp(self) -> PublicParams: ...

    @property
    def grace(self) -> float:
        """Seconds keys stay valid after their epoch's end (known once keys were issued)."""

    def crypto(self) -> RealCrypto:
        """The overlay's suite, checking signatures against this service."""

    def peer_tls(self, key: Ed25519PrivateKey, certificate_pem: str) -> PeerTLS:
        """TLS credentials of this peer's links under this service's peer-link CA."""

    def enrol_root(self, attribute: str, signer: Ed25519PrivateKey, next_epoch: bool = False
                   ) -> tuple[RootKit, float]: ...

    def enrol_subscriber(self, predicate: Predicate, next_epoch: bool = False,
                         max_credentials: int | None = 4, fine_depth: int = 1
                         ) -> tuple[SubscriberKit, float]: ...

    def enrol_publisher(self, advertisement: Predicate, max_credentials: int | None = None
                        ) -> enrolment.Publisher: ...

    def certify_link_key(self, key: Ed25519PrivateKey, addresses: list[str],
                         next_epoch: bool = False) -> TransportCertificate: ...

    def held_addresses(self) -> list[dict[str, Any]]:
        """Addresses certified to this identity and still its own."""

    def register(self, address: str, attribute: str, role: str, ttl: int,
                 seen: Sequence[str] = ()) -> None: ...

    def lookup(self, attribute: str, sample: int = 8) -> dict[str, Any]:
        """``{"roots": [...], "members": [...]}``, entries with ``address`` and ``vouched``."""

    def deregister(self, address: str, timeout: float) -> None: ...

    def close(self) -> None: ...


class SingleKeyServer:
    """One key server (``--server``), its Ed25519 key pinned, recorded or taken on trust."""

    def __init__(self, url: str, token: str, ca_file: str | None = None,
                 server_key: bytes | None = None, known: KnownServers | None = None) -> None:
        self.client = KeyServerClient(url, token, verify=ca_file or True)
        self._verify = ca_file or True
        self._server_key, self._known = server_key, known
        self.params: ServerParams | None = None
        self.where = f"the key server at {self.client.base_url}"

    def probe(self) -> None:
        """On a connection of its own each time (one kept open may be one the server
        dropped while it restarted)."""
        with KeyServerClient(self.client.base_url, retries=0, verify=self._verify) as probe:
            probe.health()

    def fetch_params(self) -> None:
        self.params = enrolment.fetch_params(self.client, self._server_key, self._known)

    @property
    def checked(self) -> ServerParams:
        if self.params is None:
            raise PeerError("the key server's parameters were not fetched")
        return self.params

    @property
    def pp(self) -> PublicParams:
        return self.checked.pp

    @property
    def grace(self) -> float:
        return float(self.checked.grace)

    def crypto(self) -> RealCrypto:
        return enrolment.real_crypto(self.checked)

    def peer_tls(self, key: Ed25519PrivateKey, certificate_pem: str) -> PeerTLS:
        return PeerTLS(key, certificate_pem, self.checked.peer_ca)

    def enrol_root(self, attribute: str, signer: Ed25519PrivateKey, next_epoch: bool = False
                   ) -> tuple[RootKit, float]:
        return enrolment.enrol_root(self.client, self.checked, attribute, signer, next_epoch)

    def enrol_subscriber(self, predicate: Predicate, next_epoch: bool = False,
                         max_credentials: int | None = 4, fine_depth: int = 1
                         ) -> tuple[SubscriberKit, float]:
        return enrolment.enrol_subscriber(self.client, self.checked, predicate, next_epoch,
                                          max_credentials, fine_depth)

    def enrol_publisher(self, advertisement: Predicate, max_credentials: int | None = None
                        ) -> enrolment.Publisher:
        return enrolment.enrol_publisher(self.client, self.checked, advertisement,
                                         max_credentials=max_credentials)

    def certify_link_key(self, key: Ed25519PrivateKey, addresses: list[str],
                         next_epoch: bool = False) -> TransportCertificate:
        return enrolment.certify_link_key(self.client, self.checked, key, addresses,
                                          next_epoch)

    def held_addresses(self) -> list[dict[str, Any]]:
        return self.client.held_addresses()

    def register(self, address: str, attribute: str, role: str, ttl: int,
                 seen: Sequence[str] = ()) -> None:
        self.client.register(address, attribute, role, ttl, seen=list(seen))

    def lookup(self, attribute: str, sample: int = 8) -> dict[str, Any]:
        return self.client.lookup(attribute, sample=sample)

    def deregister(self, address: str, timeout: float) -> None:
        self.client.deregister(address, timeout)

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class ThresholdAccess:
    """A threshold deployment as an identity reaches it: the deployment's public document
    (``threshold.json``, the same at every member; check its fingerprint with the
    operators) and the identity's access file (each member's URL and its token there,
    from ``identity threshold-add --access-file``)."""

    public_document: str
    access_file: str


def open_service(server: str | None, token: str, threshold: ThresholdAccess | None,
                 ca_file: str | None = None, server_key: bytes | None = None,
                 known: KnownServers | None = None) -> KeyService:
    """The key server at ``server`` (with the identity's ``token``), or the ``threshold``
    deployment, whose client is imported only then (PeerError if its files cannot be
    read)."""
    if threshold is not None:
        from ibe_pubsub.peer.threshold_service import ThresholdDeployment

        return ThresholdDeployment(threshold, ca_file)
    if server is None:
        raise PeerError("no key server and no threshold deployment given")
    return SingleKeyServer(server, token, ca_file, server_key, known)
