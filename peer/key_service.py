"""Where a peer's keys come from: one key server (version 2) or a threshold deployment of
``n`` members of which any ``t`` issue (version 3). The node and the publisher call a
:class:`KeyService` alike; only enrolment differs, never routing, decryption or what a
peer checks (a signature of the one key server, or of ``t`` members under ``X``).

Every call blocks (the node runs them in a worker thread, so that checking and combining
shares, tens of milliseconds of pairings, never holds up its event loop). A refusal or an
outage is a :class:`KeyServerRequestError` either way, ``down`` when waiting may help."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    PeerCertificateError,
    Predicate,
    PublicParams,
    fingerprint,
    read_peer_certificate,
    root_credential,
    threshold,
)
from ibe_pubsub.keyserver import (
    UNREACHABLE,
    KeyServerClient,
    KeyServerError,
    KeyServerRequestError,
    ServerParams,
    ThresholdEnrolmentError,
    ThresholdKeyClient,
    TransportCertificate,
)
from ibe_pubsub.overlay import RealCrypto, RootKit, SubscriberKit
from ibe_pubsub.peer import enrolment
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.known_servers import KnownServers
from ibe_pubsub.peer.tls import PeerTLS

log = logging.getLogger(__name__)
T = TypeVar("T")


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


class ThresholdDeployment:
    """``t`` of ``n`` members (:class:`keyserver.ThresholdKeyClient`), asked from an event
    loop of its own in a daemon thread: every share is checked against the deployment's
    public key and combined here, and a member that is down or answers a bad share is
    replaced by another."""

    def __init__(self, access: ThresholdAccess, ca_file: str | None = None,
                 hedge: float = 2.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="threshold-client")
        self._thread.start()
        self._closing = False
        #: Guards ``_closing`` and ``_pending``, the calls made and not yet answered.
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()
        try:  # made on its loop, whose HTTP connections it keeps
            self.client = self._run(self._client(access, ca_file, hedge))
        except BaseException:
            self._stop_loop()
            raise
        tpk = self._tpk = self.client.tpk
        self._links: threshold.QuorumSigners | None = None
        self._grace: float | None = None
        self.where = (f"the {tpk.t}-of-{tpk.n} key servers of {access.access_file} "
                      f"(deployment {fingerprint(bytes(tpk.X))})")

    @staticmethod
    async def _client(access: ThresholdAccess, ca_file: str | None, hedge: float
                      ) -> ThresholdKeyClient:
        try:
            return ThresholdKeyClient.from_files(access.public_document, access.access_file,
                                                 verify=ca_file or True, hedge=hedge)
        except KeyServerError as exc:
            raise PeerError(str(exc)) from exc

    def _run(self, call: Coroutine[Any, Any, T], timeout: float | None = None,
             needed: int | None = None) -> T:
        """``call`` on this deployment's loop; its ThresholdEnrolmentError as the
        KeyServerRequestError a single server's outage or refusal would be
        (:func:`request_error`, ``needed`` members: ``t`` unless given)."""
        with self._lock:
            if self._closing:
                call.close()
                raise KeyServerRequestError(0, f"the client of {self.where} is closed")
            future = asyncio.run_coroutine_threadsafe(call, self._loop)
            self._pending.add(future)
        future.add_done_callback(self._forget)
        try:
            return future.result(timeout)
        except ThresholdEnrolmentError as exc:
            raise request_error(exc, len(self.client.members),
                                needed or self.client.tpk.t) from exc
        except concurrent.futures.CancelledError as exc:  # closed meanwhile
            raise KeyServerRequestError(0, f"the client of {self.where} was closed") from exc
        except TimeoutError as exc:
            if timeout is None:
                raise
            if not future.cancel():  # it finished meanwhile
                return future.result()
            raise KeyServerRequestError(0, f"{self.where} did not answer within "
                                           f"{timeout:g} s") from exc
        except KeyServerRequestError:
            raise
        except KeyServerError as exc:
            raise KeyServerRequestError(0, str(exc)) from exc

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def probe(self) -> None:
        """Whether ``t`` members answer, by asking them for the schema they signed."""
        self._run(self.client.signed_schema())

    def fetch_params(self) -> None:
        self._run(self.client.params())
        self._links = self._run(self.client.link_verifier())

    @property
    def pp(self) -> PublicParams:
        return self.client.pp

    @property
    def grace(self) -> float:
        if self._grace is None:
            raise PeerError("no keys were issued yet")
        return self._grace

    def _issued(self, what: str, members: Sequence[int], epoch_end: float,
                expires_at: int) -> None:
        """Keeps what ``t`` members agreed on about the keys just combined: how long the
        grace after their epoch lasts."""
        self._grace = max(0.0, expires_at - epoch_end)
        log.info("%s combined from members %s (valid until %d)", what, list(members),
                 expires_at)

    def crypto(self) -> RealCrypto:
        return RealCrypto(self.pp, threshold.ThresholdServer(self.client.group, self._tpk.X))

    def peer_tls(self, key: Ed25519PrivateKey, certificate_pem: str) -> PeerTLS:
        if self._links is None:
            raise PeerError("the members' keys were not fetched")
        return PeerTLS(key, certificate_pem, self.client.handshake_ca, links=self._links)

    def enrol_root(self, attribute: str, signer: Ed25519PrivateKey, next_epoch: bool = False
                   ) -> tuple[RootKit, float]:
        raw = signer.public_key().public_bytes_raw()
        combined = self._run(self.client.enrol_root(attribute, raw, _epoch(next_epoch)))
        certificate = combined.certificate
        self._issued(f"root certificate of {attribute!r}", combined.members,
                     combined.epoch_end, certificate.expires_at)
        credential = root_credential(self.pp.schema.attribute(attribute))
        return (RootKit(credential, certificate.epoch, certificate.to_bytes(), signer,
                        combined.token), combined.epoch_end)

    def enrol_subscriber(self, predicate: Predicate, next_epoch: bool = False,
                         max_credentials: int | None = 4, fine_depth: int = 1
                         ) -> tuple[SubscriberKit, float]:
        combined = self._run(self.client.enrol_subscriber(
            str(predicate), fine_depth, max_credentials, _epoch(next_epoch)))
        self._issued(f"subscriber keys of epoch {combined.key.epoch}", combined.members,
                     combined.epoch_end, combined.expires_at)
        return (enrolment.subscriber_kit(self.pp, combined.key.epoch, combined.key,
                                         combined.requests, predicate),
                combined.epoch_end)

    def enrol_publisher(self, advertisement: Predicate, max_credentials: int | None = None
                        ) -> enrolment.Publisher:
        combined = self._run(self.client.enrol_publisher(str(advertisement), max_credentials))
        self._issued(f"publisher keys of epoch {combined.keys[0].epoch}", combined.members,
                     combined.epoch_end, combined.expires_at)
        return enrolment.Publisher(combined.keys[0].epoch, combined.epoch_end, advertisement,
                                   combined.keys)

    def certify_link_key(self, key: Ed25519PrivateKey, addresses: list[str],
                         next_epoch: bool = False) -> TransportCertificate:
        combined = self._run(self.client.certify_link_key(
            key.public_key().public_bytes_raw(), addresses, _epoch(next_epoch)),
            needed=threshold.link_quorum(self._tpk.t, self._tpk.n))
        self._issued("link certificate", combined.members, combined.epoch_end,
                     combined.not_after)
        try:  # the client read it so already; this gives the peer its binding
            certificate = read_peer_certificate(x509.load_pem_x509_certificate(
                combined.certificate.encode("ascii")), self._links)
        except (PeerCertificateError, ValueError) as exc:
            raise KeyServerRequestError(0, f"the members' link certificate: {exc}") from exc
        return TransportCertificate(combined.certificate, certificate)

    def held_addresses(self) -> list[dict[str, Any]]:
        """Those that ``t`` members still count as this identity's."""
        return self._run(self.client.held_addresses(), needed=1)

    def register(self, address: str, attribute: str, role: str, ttl: int,
                 seen: Sequence[str] = ()) -> None:
        self._run(self.client.register(address, attribute, role, ttl, seen), needed=1)

    def lookup(self, attribute: str, sample: int = 8) -> dict[str, Any]:
        """The merged listing, less what too few members list (:func:`well_listed`)."""
        return well_listed(self._run(self.client.lookup(attribute, sample), needed=1),
                           self._tpk.t)

    def deregister(self, address: str, timeout: float) -> None:
        self._run(self.client.deregister(address), timeout, needed=1)

    def close(self) -> None:
        """Ends every call still running (its caller gets a KeyServerRequestError at once:
        a peer stopped while a member hangs must not wait for it), then the client."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            pending = list(self._pending)
        for future in pending:
            future.cancel()  # and the task on the loop with it
        with contextlib.suppress(Exception):  # closing: nothing waits for these answers
            asyncio.run_coroutine_threadsafe(self.client.aclose(), self._loop).result(5.0)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()


def request_error(exc: ThresholdEnrolmentError, members: int, needed: int
                  ) -> KeyServerRequestError:
    """A failure of too many members as a single server's KeyServerRequestError: ``down``
    (worth waiting for, as for a key server that restarts) when some members were
    unreachable and, were they back, ``needed`` of the ``members`` could answer, whatever
    the others refused; ``code``, the members' error code when all that refused gave the
    same one (``address_taken``: the port is another identity's)."""
    down = {f.index for f in exc.failures if f.code == UNREACHABLE}
    refused = {f.index for f in exc.failures} - down
    codes = {f.code for f in exc.failures if f.code not in (None, UNREACHABLE)}
    body = {"error": {"message": str(exc), "code": next(iter(codes)) if len(codes) == 1
                      else None}}
    error = KeyServerRequestError(0, body)
    error.down = bool(down) and members - len(refused) >= needed
    return error


def well_listed(listing: dict[str, Any], t: int) -> dict[str, Any]:
    """A merged directory listing less the roots that fewer members list than ``t``, or
    than the most listed root where none reaches ``t``. Every member that answers lists
    every root leased there, so a root invented by fewer than ``t`` members would
    otherwise be a contact as good as a real one, and one hostile member could fill a
    joiner's contacts with 256 addresses that never answer. Other members of the tree are
    each member's random sample, mostly listed once: they stay, and a hostile member adds
    at most a sample's worth of them (``read_listing``)."""
    floor = min(t, max((e["listed_by"] for e in listing["roots"]), default=0))
    return listing | {"roots": [e for e in listing["roots"] if e["listed_by"] >= floor]}


def _epoch(next_epoch: bool) -> str | None:
    return "next" if next_epoch else None
