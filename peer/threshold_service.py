"""A threshold deployment as a peer's key service (:class:`peer.key_service.KeyService`):
``t`` of ``n`` members asked through :class:`keyserver.ThresholdKeyClient`, every share
checked and combined here. Loaded only by peers that use one (``peer.key_service.open``),
so that a peer of one key server does not import the threshold client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

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
    KeyServerError,
    KeyServerRequestError,
    ThresholdEnrolmentError,
    ThresholdKeyClient,
    TransportCertificate,
)
from ibe_pubsub.overlay import RealCrypto, RootKit, SubscriberKit
from ibe_pubsub.peer import enrolment
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.tls import PeerTLS

if TYPE_CHECKING:  # the module that loads this one, only when a peer uses a deployment
    from ibe_pubsub.peer.key_service import ThresholdAccess

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        tpk = self.client.tpk
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
        return RealCrypto(self.pp, threshold.ThresholdServer(self.client.group, self.client.tpk.X))

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
            needed=threshold.link_quorum(self.client.tpk.t, self.client.tpk.n))
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
                           self.client.tpk.t)

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
