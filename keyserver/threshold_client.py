"""Enrolment with a threshold deployment (docs/scheme.md section 16): ask ``t`` members for
their shares at once, check every share against the deployment's public key, and combine
the shares of one set of ``t`` members into ordinary version-2 keys. A member that is down,
refuses, or answers a share that does not verify is replaced by the next one, and the
reason is kept in the result, so an application can alert on a member answering bad
shares.

A subscriber's enrolment also brings one connection request per credential, signed by the
same ``t`` members: the client draws a seed and a secret ``s``, every member derives the
same request from the seed (for a credential the identity may hold), with its own binding
``V_c = V^h_c`` of ``V = ĝ^s`` in it (``h_c`` a PRF of the seed), signs it with its share
of the deployment's signing key and answers it with its signature. The client takes the
request ``t`` members answered byte for byte, and combines their partial signatures,
which peers check against ``X`` (``ThresholdServer``); it derives only the request's
secrets from the seed (no group operation), and binds them to ``s_c = s h_c``, so the
members, who know the seed, cannot prove an opening.

A peer's link key is certified otherwise (:meth:`ThresholdKeyClient.certify_link_key`): a
quorum of ``ceil((n + t) / 2)`` members (more than ``t``, so that an address is certified
to one identity only) each sign its key, binding and expiry with their own member key;
the signatures travel in a certificate of the deployment's public handshake CA, which
peers check after the TLS handshake (``credentials.peer_certificates``) against the member
keys that ``t`` members signed under ``X``.

Members answer only for identities registered and allowed there, so each member has its
own token. Shares are combined only among members that issued for the same epoch and the
same credentials: keys exist only where ``t`` members agree. The schema, unless given, is
the one ``t`` members signed with their shares of the deployment's signing key, so no
single member can hand a client another event space.

    # threshold.json from the operators; alice.json from `identity threshold-add`
    async with ThresholdKeyClient.from_files("threshold.json", "alice.json") as client:
        combined = await client.enrol_subscriber("symbol = IBM")
        key = combined.key        # a SubscriberKey like version 2's
        requests = combined.requests  # signed connection requests, one per credential
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import secrets
import ssl
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ibe_pubsub.credentials import (
    ED25519_KEY_BYTES,
    ROLES,
    ConnectionRequest,
    Credential,
    Ed25519Server,
    Element,
    PairingGroup,
    PeerBinding,
    PublicParams,
    PublisherKey,
    RootCertificate,
    RoutingToken,
    Schema,
    SubscriberKey,
    codec,
    handshake_ca_certificate,
    handshake_ca_key,
    issue_peer_certificate,
    load_group,
    peer_link_message,
    read_peer_certificate,
    root_certificate_message,
    root_credential,
    schema_message,
    scheme,
    to_pem,
)
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver.api_models import MAX_CREDENTIALS, MAX_FINE_CREDENTIALS
from ibe_pubsub.keyserver.bundles import IssuedRequest
from ibe_pubsub.keyserver.client import (
    KEEPALIVE_SECONDS,
    KeyServerRequestError,
    transport_failure,
)
from ibe_pubsub.keyserver.exceptions import KeyServerError
from ibe_pubsub.keyserver.threshold_directory import (
    DirectoryAnswerError,
    Listing,
    merge_listings,
    read_listing,
)
from ibe_pubsub.keyserver.threshold_store import read_public_document

log = logging.getLogger(__name__)
#: Bounds on one member's answer: any but a subscriber's holds at most 256 keys, about
#: 120 KiB of base64; a subscriber's may hold 256 credentials, a connection request for
#: each, and 4096 fine tokens (keyserver.enrolment; :func:`max_answer_bytes`).
MAX_ANSWER_BYTES = 512 * 1024
MAX_KEYS = MAX_CREDENTIALS + MAX_FINE_CREDENTIALS
#: More than a request's fields and one entry's (U, 96 bytes, and a 62-byte box) encode to,
#: and than a fine token's (T, 48 bytes, and its framing) beside its attribute and path.
REQUEST_BYTES, REQUEST_ENTRY_BYTES, TOKEN_BYTES = 512, 256, 128
#: How many of its members' recent answer times a client keeps to set its hedge delay.
ANSWER_TIMES_KEPT = 32
#: The access file's format (``ibe-pubsub identity threshold-add --access-file``).
ACCESS_FORMAT = "ibe-pubsub-threshold-access-v1"
#: Longer than any identity name a key server registers.
MAX_IDENTITY = 1024
#: More addresses than an identity may hold (keyserver ``max_peer_addresses``) by far.
MAX_HELD = 256
#: The code of a Failure of a member that is down (waiting for it may help).
UNREACHABLE = "unreachable"
#: How much of a member's failure reason is kept: its text may quote the member's.
MAX_REASON = 300
#: Seconds after which a member that still fails the same way is warned about again, and
#: within which it is warned about once however it fails.
REWARN_SECONDS, WARN_GAP = 600.0, 10.0
Share = TypeVar("Share")
Outcome = TypeVar("Outcome")
Shape = tuple[Any, ...]
"""What the shares to combine must agree on: the epoch first, then the credentials, the
identity they were issued to (and a subscriber's expiry)."""


@dataclass(frozen=True)
class MemberAccess:
    """Where member ``index`` of the deployment answers, and this identity's token there."""

    index: int
    url: str
    token: str


def read_access_file(path: Path) -> list[MemberAccess]:
    """The members an identity may ask and its token at each, as ``identity threshold-add``
    wrote them."""
    try:
        document = json.loads(path.read_text())
        if not isinstance(document, dict) or document.get("format") != ACCESS_FORMAT:
            raise KeyServerError(f"{path} is not a {ACCESS_FORMAT} file")
        return [MemberAccess(int(m["index"]), str(m["url"]), str(m["token"]))
                for m in document["members"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeyServerError(f"{path}: not a readable access file ({exc})") from exc


@dataclass(frozen=True)
class Failure:
    """A member whose answer was not used, and why. ``code``: the error code of a member
    that refused, or ``UNREACHABLE`` for one that is down (it refused the connection,
    closed it without an answer, timed out, or said it is unavailable)."""

    index: int
    reason: str
    code: str | None = None


@dataclass(frozen=True)
class CombinedSubscriberKey:
    key: SubscriberKey
    epoch_end: float
    """When the key's epoch ends; the key is valid until ``expires_at``, a grace later."""
    expires_at: int
    requests: tuple[IssuedRequest, ...]
    """One connection request per credential, signed by the same members (in the order of
    ``key.credentials``)."""
    members: tuple[int, ...]
    """The members whose shares were combined."""
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class TakenAt:
    """Which members took a request made at every member (a directory lease), and why the
    others did not."""

    members: tuple[int, ...]
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class CombinedPublisherKeys:
    keys: tuple[PublisherKey, ...]
    epoch_end: float
    expires_at: int
    """When the keys' epoch ends, and when they expire, a grace later."""
    members: tuple[int, ...]
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class CombinedRoot:
    """A root peer's certificate of its transport key, signed by ``t`` members (checked
    against ``X``), and its whole-domain routing token combined from their shares."""

    certificate: RootCertificate
    token: RoutingToken
    epoch_end: float
    members: tuple[int, ...]
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class CombinedLinkCertificate:
    """A peer's link certificate: its binding, expiry and key signed by a quorum of members
    (``link_quorum``), each with its own key (checked against the member keys ``t`` members
    signed under ``X``), in an X.509 certificate of the deployment's handshake CA: a peer's
    TLS credentials are ``PeerTLS(key, certificate, client.handshake_ca,
    links=await client.link_verifier())``."""

    certificate: str
    """PEM."""
    binding: PeerBinding
    epoch_end: float
    not_after: int
    members: tuple[int, ...]
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class SignedSchema:
    """The schema ``t`` members signed, and their combined signature ``H_sig(m)^x``
    (checked against the deployment's ``X``)."""

    schema: Schema
    signature: Element
    members: tuple[int, ...]
    failures: tuple[Failure, ...]


class ThresholdEnrolmentError(KeyServerError):
    """Fewer than ``t`` members answered shares that verify and agree; ``failures`` says
    which members and why."""

    failures: tuple[Failure, ...] = ()


def _no_agreement(t: int, failures: Sequence[Failure]) -> ThresholdEnrolmentError:
    return _failed_at_members(f"no {t} members answered shares that verify and agree",
                              failures)


def _failed_at_members(summary: str, failures: Sequence[Failure]) -> ThresholdEnrolmentError:
    reasons = "; ".join(f"member {f.index}: {f.reason}" for f in failures)
    error = ThresholdEnrolmentError(f"{summary} ({reasons})")
    error.failures = tuple(failures)
    return error


class _BadAnswer(Exception):
    """A member's answer that cannot be used (its text is the reason; ``code`` the error
    code of a refusal)."""

    code: str | None = None


@dataclass
class _Views:
    """What this client derives of each request of one enrolment from its seed and ``s``
    (``scheme.requester_view``), once per credential, epoch and expiry, whichever member
    answers first."""

    pp: PublicParams
    seed: bytes
    s: int
    derived: dict[tuple[str, Credential, int, int], scheme.RequesterView] = field(
        default_factory=dict)

    def of(self, identity: str, credential: Credential, epoch: int, expires_at: int
           ) -> scheme.RequesterView:
        key = (identity, credential, epoch, expires_at)
        if key not in self.derived:
            self.derived[key] = scheme.requester_view(self.pp, *key, self.seed, self.s)
        return self.derived[key]


@dataclass(frozen=True)
class _SubscriberAnswer:
    share: T.SubscriberKeyShare
    identity: str
    epoch_end: float
    expires_at: int
    requests: tuple[ConnectionRequest, ...]
    """One per credential of the share, in its order, unsigned; and this member's partial
    signature of each."""
    request_partials: tuple[T.PartialSignature, ...]


@dataclass(frozen=True)
class _RootAnswer:
    certificate: RootCertificate
    """Unsigned: the signature is what ``t`` partials combine into."""
    partial: T.PartialSignature
    token: T.TokenShare
    epoch_end: float


@dataclass
class _Collected(Generic[Share]):
    shares: dict[int, Share]
    failures: list[Failure]


class ThresholdKeyClient:
    """Async client of ``t``-of-``n`` members; ``members`` lists those this identity may
    ask (at least ``t``). ``spread`` starts at a random member so that many clients share
    the load; without it members are asked in the order given. A member is given up after
    ``timeout`` seconds, and when no member answered for ``hedge`` seconds (or twice the
    median of this client's recent answer times, when longer) one more is
    asked. Without ``schema``, the first enrolment takes the one ``t`` members signed
    (:meth:`signed_schema`)."""

    def __init__(self, tpk: T.ThresholdPublicKey, members: Sequence[MemberAccess], *,
                 schema: Schema | None = None, group: PairingGroup | None = None,
                 timeout: float = 30.0, spread: bool = True,
                 verify: bool | str | ssl.SSLContext = True, hedge: float = 2.0) -> None:
        indices = [m.index for m in members]
        if len(set(indices)) != len(indices) or any(not 0 < i <= tpk.n for i in indices):
            raise KeyServerError(f"members must be distinct servers of 1..{tpk.n}, got "
                                 f"{indices}")
        if len(members) < tpk.t:
            raise KeyServerError(f"combining needs {tpk.t} members, {len(members)} given")
        if isinstance(verify, str):
            try:
                verify = ssl.create_default_context(cafile=verify)
            except (OSError, ssl.SSLError) as exc:
                raise KeyServerError(f"cannot read the CA file {verify}: {exc}") from exc
        self.group = group or load_group()
        self._pp = PublicParams(self.group, tpk.mpk, schema) if schema is not None else None
        self.tpk, self.members, self.spread = tpk, tuple(members), spread
        self.timeout, self.hedge = timeout, hedge
        self._answer_times: deque[float] = deque(maxlen=ANSWER_TIMES_KEPT)
        self._member_keys: dict[int, bytes] | None = None
        #: How each member last failed, and when that was warned about.
        self._warned: dict[int, tuple[str, float]] = {}
        self._http = httpx.AsyncClient(timeout=timeout, verify=verify,
                                       limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS))

    @classmethod
    def from_files(cls, public_document: str | Path, access_file: str | Path,
                   group: PairingGroup | None = None, **options: Any) -> ThresholdKeyClient:
        """A client of the deployment of ``public_document`` (its ``threshold.json``) for
        the identity of ``access_file`` (from ``identity threshold-add --access-file``);
        ``options`` as for the constructor. KeyServerError if either cannot be read."""
        group = group or load_group()
        _, tpk = read_public_document(Path(public_document), group)
        return cls(tpk, read_access_file(Path(access_file)), group=group, **options)

    async def __aenter__(self) -> ThresholdKeyClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def pp(self) -> PublicParams:
        """The public parameters: the deployment's master public key and the schema."""
        if self._pp is None:
            raise KeyServerError("no schema yet: give one, or await params() first")
        return self._pp

    async def params(self) -> PublicParams:
        """The public parameters, with the schema ``t`` members signed unless one was
        given (asked for once)."""
        if self._pp is None:
            signed = await self.signed_schema()
            self._pp = PublicParams(self.group, self.tpk.mpk, signed.schema)
        return self._pp

    async def signed_schema(self) -> SignedSchema:
        """The schema of ``t`` members whose partial signatures of it verify, combined into
        the deployment's signature (``/v3/schema``; public, no token). A member that signs
        another schema, or whose signature does not verify, is replaced like one that
        answers a bad share."""
        found = await self._collect("/v3/schema", None, self._schema,
                                    lambda _: "schema agrees", "the schema")
        schema = next(iter(found.shares.values()))[0]
        signature = T.combine_signatures(self.group, self.tpk,
                                         [partial for _, partial in found.shares.values()])
        if not T.verify_signature(self.group, self.tpk.X, schema_message(schema), signature):
            raise KeyServerError("the members' schema signatures combine into one that does "
                                 "not verify")  # only with a threshold.json whose g_hat
                                                # is not the group's generator
        return SignedSchema(schema, signature, tuple(found.shares), tuple(found.failures))

    async def enrol_subscriber(self, subscription: str, fine_depth: int = 1,
                               max_credentials: int | None = None,
                               epoch: str | int | None = None) -> CombinedSubscriberKey:
        """Keys for ``subscription`` combined from ``t`` members' verified shares."""
        pp = await self.params()
        seed, s = secrets.token_bytes(scheme.REQUEST_SEED_BYTES), self.group.random_scalar()
        binding = self.group.exp_secret(pp.mpk.g_hat, s)
        body = {"subscription": subscription, "fine_depth": fine_depth,
                "max_credentials": max_credentials, "epoch": epoch,
                "request_seed": base64.b64encode(seed).decode("ascii"),
                "request_binding": base64.b64encode(bytes(binding)).decode("ascii")}
        views = _Views(pp, seed, s)
        found = await self._collect(
            "/v3/enrol/subscriber", body,
            lambda index, answer: self._subscriber(views, index, answer),
            agreed="the epoch, credentials, identity and connection requests",
            limit=max_answer_bytes(pp.schema))
        answers = list(found.shares.values())
        key = T.combine_subscriber_key(self.pp, self.tpk, [a.share for a in answers])
        first = answers[0]  # the requests, identity and expiry are what the answers agree on
        issued = []
        for k, credential in enumerate(c.credential for c in key.credentials):
            signed = T.signed_request(self.group, self.tpk, first.requests[k],
                                      [a.request_partials[k] for a in answers])
            view = views.of(first.identity, credential, key.epoch, first.expires_at)
            issued.append(IssuedRequest(credential.attribute, credential, signed,
                                        scheme.bind_request_secrets(pp, credential, key.epoch,
                                                                    view.sws, view.s_c)))
        return CombinedSubscriberKey(key, first.epoch_end, first.expires_at, tuple(issued),
                                     tuple(found.shares), tuple(found.failures))

    async def enrol_root(self, attribute: str, transport_key: bytes,
                         epoch: str | int | None = None) -> CombinedRoot:
        """A root's certificate of ``transport_key`` (raw Ed25519, 32 bytes) for the tree of
        ``attribute``, and its whole-domain token, each combined from ``t`` members'
        verified partial signature and token share."""
        if len(transport_key) != ED25519_KEY_BYTES:
            raise KeyServerError("a transport key is a raw 32-byte Ed25519 public key")
        pp = await self.params()
        credential = root_credential(pp.schema.attribute(attribute))
        body = {"attribute": attribute, "epoch": epoch,
                "transport_key": base64.b64encode(transport_key).decode("ascii")}
        found = await self._collect(
            "/v3/enrol/root", body,
            lambda index, answer: self._root(credential, transport_key, epoch, index, answer),
            agreed="the epoch, expiry and identity")
        answers = list(found.shares.values())
        certificate = answers[0].certificate
        signature = T.combine_signatures(self.group, self.tpk, [a.partial for a in answers])
        signed = replace(certificate, signature=bytes(signature))
        if not signed.verify(T.ThresholdServer(self.group, self.tpk.X)):
            raise KeyServerError("the members' certificate signatures combine into one that "
                                 "does not verify")  # as for the schema: a bad threshold.json
        token = T.combine_token(pp, self.tpk, [a.token for a in answers])
        return CombinedRoot(signed, token, answers[0].epoch_end, tuple(found.shares),
                            tuple(found.failures))

    async def member_keys(self) -> dict[int, bytes]:
        """Every member's own Ed25519 key, as ``t`` members signed them with their shares
        (``/v3/members``, checked against ``X``; asked for once): the keys that check a
        peer-link certificate's signatures."""
        if self._member_keys is None:
            found = await self._collect("/v3/members", None, self._members,
                                        lambda _: "member list agrees", "the member keys")
            keys = next(iter(found.shares.values()))[0]
            signature = T.combine_signatures(self.group, self.tpk, [
                partial for _, partial in found.shares.values()])
            if not T.verify_signature(self.group, self.tpk.X, T.members_message(
                    self.tpk, keys), signature):
                raise KeyServerError("the members' signatures of the member keys combine "
                                     "into one that does not verify")  # a bad threshold.json
            self._member_keys = keys
        return self._member_keys

    async def link_verifier(self) -> T.QuorumSigners:
        """The deployment as the signer of peer-link certificates (``PeerTLS(links=...)``):
        ``link_quorum(t, n)`` members must each have signed one with their own key."""
        return T.QuorumSigners(await self.member_keys(),
                               T.link_quorum(self.tpk.t, self.tpk.n),
                               T.deployment_scope(self.tpk))

    @property
    def handshake_ca(self) -> str:
        """The deployment's handshake CA certificate (PEM), the CA of ``PeerTLS`` on its
        peer links: derived from ``X`` by everyone alike, so it vouches for nothing; the
        members' signature in each certificate does."""
        return to_pem(handshake_ca_certificate(bytes(self.tpk.X)))

    async def certify_link_key(self, link_key: bytes, addresses: Sequence[str] = (),
                               epoch: str | None = None) -> CombinedLinkCertificate:
        """A certificate of ``link_key`` (raw Ed25519, 32 bytes) for this identity at
        ``addresses`` (none for a peer that does not listen), this epoch or the ``"next"``,
        signed by ``q = link_quorum(t, n)`` members (4 of 5 at threshold 3) that agree on
        the binding (role, and a root's trees) and its expiry. Each member that certifies
        claims the addresses for the identity, as version 2's key server does; any two sets
        of ``q`` members share an honest one, which certifies an address to one identity
        only, so no two identities hold certificates for one address while fewer than
        ``t`` members misbehave. Every member is asked (those slower than the hedge delay
        after ``q`` agreed are not waited for)."""
        if len(link_key) != ED25519_KEY_BYTES:
            raise KeyServerError("a link key is a raw 32-byte Ed25519 public key")
        quorum = T.link_quorum(self.tpk.t, self.tpk.n)
        if len(self.members) < quorum:
            raise KeyServerError(f"a link certificate needs the signatures of {quorum} of the "
                                 f"{self.tpk.n} members; this client may ask "
                                 f"{len(self.members)}")
        links = await self.link_verifier()
        encoded = base64.b64encode(link_key).decode("ascii")
        body = {"public_key": encoded, "addresses": list(addresses), "epoch": epoch}
        found = await self._collect(
            "/v3/enrol/transport", body,
            lambda index, answer: self._link(links, link_key, encoded, tuple(addresses),
                                             index, answer),
            agreed="the binding and expiry", everyone=True, needed=quorum)
        (binding, epoch_end, not_after), _ = next(iter(found.shares.values()))
        signature = T.encode_quorum_signature({index: signed for index, (_, signed) in
                                               found.shares.items()})
        certificate = issue_peer_certificate(
            handshake_ca_key(bytes(self.tpk.X)), Ed25519PublicKey.from_public_bytes(link_key),
            binding, time.time(), not_after, link_signature=signature)
        read_peer_certificate(certificate, links)  # as peers will read it
        return CombinedLinkCertificate(to_pem(certificate), binding, epoch_end, not_after,
                                       tuple(found.shares), tuple(found.failures))

    # -- the directory, at every member (keyserver.threshold_directory) ---------------------

    async def register(self, address: str, attribute: str, role: str, ttl: int,
                       seen: Sequence[str] = ()) -> TakenAt:
        """Lease ``address`` (certified to this identity) in ``attribute``'s tree at every
        member, vouching for the ``seen`` neighbours there that answered recently, as
        ``/v1/directory`` does at one server. Raises ThresholdEnrolmentError if no member
        took it."""
        body = {"address": address, "attribute": attribute, "role": role, "ttl": ttl,
                "seen": list(seen)}
        return self._took(await self._everyone("/v1/directory", body, "POST"), "lease")

    async def deregister(self, address: str) -> TakenAt:
        """Remove this identity's entries for ``address`` in every tree, at every member."""
        return self._took(await self._everyone(f"/v1/directory/{quote(address, safe='')}",
                                               None, "DELETE"), "removal")

    async def lookup(self, attribute: str, sample: int = 8) -> dict[str, Any]:
        """The tree's roots and members as the members that answered list them, merged:
        each address once per list, with ``listed_by`` (how many members listed it) and
        ``vouched_by``, most listed first, ties in random order
        (``threshold_directory.merge_listings``). Raises ThresholdEnrolmentError if no
        member answered."""
        def listing(_index: int, answer: Any) -> Listing:
            try:
                return read_listing(attribute, answer, sample)
            except DirectoryAnswerError as exc:
                raise _BadAnswer(str(exc)) from exc

        answers = await self._everyone(
            f"/v1/directory/{quote(attribute, safe='')}?sample={int(sample)}", None, "GET",
            listing)
        listings = [a for a in answers.values() if not isinstance(a, Failure)]
        failures = self._failed(answers)
        if not listings:
            raise _failed_at_members(f"no member listed the tree {attribute!r}", failures)
        # A subscriber is in a tree only at the members that issued it keys for it.
        self._report([f for f in failures if f.code != "not_in_tree"])
        return merge_listings(attribute, listings)

    async def held_addresses(self) -> list[dict[str, Any]]:
        """This identity's certified addresses that at least ``t`` members still count as
        its own (``GET /v1/enrol/transport`` at every member), ``{address, expires_at}``
        (the median of the members'), latest first: a peer restarted without a fixed port
        takes one of them again. Fewer than ``t`` members cannot make it take another
        identity's address: a quorum must certify any address anyway."""
        def held(_index: int, answer: Any) -> dict[str, float]:
            entries = answer.get("addresses") if isinstance(answer, dict) else None
            if not isinstance(entries, list) or len(entries) > MAX_HELD:
                raise _BadAnswer("its held addresses are not a list of at most "
                                 f"{MAX_HELD}")
            found = {}
            for entry in entries:
                address, expiry = entry.get("address"), entry.get("expires_at")
                if not isinstance(address, str) or not isinstance(expiry, int | float) \
                        or not 0 <= expiry < 2**63:
                    raise _BadAnswer("a held address is not an address and an expiry")
                found[address] = float(expiry)
            return found

        answers = await self._everyone("/v1/enrol/transport", None, "GET", held)
        self._report(self._failed(answers))
        expiries: dict[str, list[float]] = {}
        for listing in (a for a in answers.values() if not isinstance(a, Failure)):
            for address, expiry in listing.items():
                expiries.setdefault(address, []).append(expiry)
        kept = [{"address": address, "expires_at": statistics.median_low(times)}
                for address, times in expiries.items() if len(times) >= self.tpk.t]
        return sorted(kept, key=lambda e: -e["expires_at"])

    async def _everyone(self, path: str, body: dict[str, Any] | None, method: str,
                        read: Callable[[int, Any], Any] = lambda _index, answer: answer
                        ) -> dict[int, Any]:
        """Every member's answer (``read`` from it) or Failure, asked at once with this
        identity's token. Once ``t`` members answered, the others are given the hedge
        delay: a member that trickles its answer fails alone, without holding every call
        up for the timeout."""
        loop, t = asyncio.get_running_loop(), self.tpk.t
        asked = {asyncio.create_task(self._answer(m, path, body, read, MAX_ANSWER_BYTES,
                                                  method)): m for m in self.members}
        outcomes: dict[int, Any] = {}
        pending, settle_by = set(asked), None
        try:
            while pending:
                wait = None if settle_by is None else max(0.0, settle_by - loop.time())
                done, pending = await asyncio.wait(pending, timeout=wait,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                for task in done:
                    outcomes[asked[task].index] = task.result()
                if settle_by is None and sum(not isinstance(o, Failure)
                                             for o in outcomes.values()) >= t:
                    settle_by = loop.time() + self.hedge
        finally:
            for task in pending:
                task.cancel()
        for task in pending:
            index = asked[task].index
            outcomes[index] = Failure(index, f"it had not answered {self.hedge:g} s after "
                                             f"{t} others")
        return dict(sorted(outcomes.items()))

    @staticmethod
    def _failed(answers: dict[int, Any]) -> list[Failure]:
        return [a for a in answers.values() if isinstance(a, Failure)]

    def _took(self, answers: dict[int, Any], what: str) -> TakenAt:
        failures = self._failed(answers)
        took = tuple(i for i, a in answers.items() if not isinstance(a, Failure))
        if not took:
            raise _failed_at_members(f"no member took the {what}", failures)
        self._report(failures)
        if len(took) < self.tpk.t:
            log.warning("the %s was taken by %d members only, fewer than t = %d: lookups "
                        "at the others do not find it", what, len(took), self.tpk.t)
        log.debug("%s taken by members %s", what, list(took))
        return TakenAt(took, tuple(failures))

    async def enrol_publisher(self, advertisement: str, max_credentials: int | None = None,
                              epoch: str | int | None = None) -> CombinedPublisherKeys:
        """One publisher key per credential of ``advertisement``, combined likewise."""
        body = {"advertisement": advertisement, "max_credentials": max_credentials,
                "epoch": epoch}
        await self.params()
        found = await self._collect("/v3/enrol/publisher", body, self._publisher)
        per_member = [shares for _, shares in found.shares.values()]
        keys = tuple(T.combine_publisher_key(self.pp, self.tpk, [shares[k] for shares in
                                                                 per_member])
                     for k in range(len(per_member[0])))
        (epoch_end, expires_at), _ = next(iter(found.shares.values()))
        return CombinedPublisherKeys(keys, epoch_end, expires_at, tuple(found.shares),
                                     tuple(found.failures))

    # -- reading one member's answer: (what must agree, the verified share) ------------------

    def _subscriber(self, views: _Views, index: int, answer: Any
                    ) -> tuple[Shape, _SubscriberAnswer]:
        share = T.decode_subscriber_share(self.pp.group, _decoded(answer["share"]))
        key = share.key
        credentials = tuple(k.credential for k in key.credentials)
        fine = tuple(f.credential for f in key.fine_tokens)
        _check_index(index, share.index)
        _check_count(len(credentials) + len(fine))
        identity = _identity(answer)
        if not T.verify_subscriber_share(self.pp, self.tpk, share, identity, key.epoch,
                                         credentials, fine):
            raise _BadAnswer("its share does not verify against the deployment's public key")
        expires_at = answer["expires_at"]
        if not isinstance(expires_at, int) or not 0 <= expires_at < 2**63:
            raise _BadAnswer("its expires_at is not a time")
        epoch_end = _epoch_end(answer, expires_at)
        signed = _signed_requests(answer, credentials)
        bodies = tuple(body for body, _ in signed)
        requests = tuple(self._request(body, c, key.epoch, expires_at,
                                       views.of(identity, c, key.epoch, expires_at))
                         for body, c in zip(bodies, credentials, strict=True))
        partials = tuple(T.decode_partial_signature(self.group, signature)
                         for _, signature in signed)
        for partial in partials:
            _check_index(index, partial.index)
        if not T.verify_partial_signatures(self.group, self.tpk, bodies, partials):
            raise _BadAnswer("its signatures of the connection requests do not verify against "
                             "the deployment's public key")
        return ((key.epoch, credentials, fine, identity, expires_at, bodies, epoch_end),
                _SubscriberAnswer(share, identity, epoch_end, expires_at, requests, partials))

    def _request(self, body: bytes, credential: Credential, epoch: int, expires_at: int,
                 view: scheme.RequesterView) -> ConnectionRequest:
        """The member's connection request for ``credential``, if it is for what was asked:
        its attribute, the epoch and expiry of the share, one entry per position, and what
        this client can check of a body without building it (``view.matches``: its
        ``V_c``, and entry 0, so that members of another release are found here). Its other
        entries are checked only by the ``t`` members that sign the same bytes: a member
        that answers other entries forms a group of its own."""
        request = codec.decode_request_body(self.group, body)
        if ((request.attribute, request.epoch, request.expires_at) != (
                credential.attribute, epoch, expires_at)
                or len(request.entries) != self.pp.schema.attribute(
                    credential.attribute).positions):
            raise _BadAnswer(f"its connection request for {credential.label()} is not the one "
                             "asked for")
        if not view.matches(request):
            raise _BadAnswer(f"its connection request for {credential.label()} is not the one "
                             "asked for: this client's seed does not give it (a member of "
                             "another release than the client?)")
        return request

    def _publisher(self, index: int, answer: Any
                   ) -> tuple[Shape, tuple[tuple[float, int], list[T.PublisherKeyShare]]]:
        _check_count(len(answer["shares"]), MAX_CREDENTIALS)
        shares = [T.decode_publisher_share(self.pp.group, _decoded(s))
                  for s in answer["shares"]]
        if not shares:
            raise _BadAnswer("it answered no share")
        epoch, identity = shares[0].key.epoch, _identity(answer)
        if "expires_at" not in answer:
            raise _BadAnswer("it answered no expires_at with its shares (a member of an "
                             "earlier release than this client)")
        _, expires_at = _epoch_and_expiry(answer, "expires_at", epoch)  # the shares' epoch
        epoch_end = _epoch_end(answer, expires_at)
        for share in shares:
            _check_index(index, share.index)
            if share.key.epoch != epoch or not T.verify_publisher_share(
                    self.pp, self.tpk, share, identity, share.key.credential, epoch):
                raise _BadAnswer("a share does not verify against the deployment's public key")
        return ((epoch, tuple(s.key.credential for s in shares), identity, epoch_end,
                 expires_at), ((epoch_end, expires_at), shares))

    def _root(self, credential: Credential, transport_key: bytes, asked: str | int | None,
              index: int, answer: Any
              ) -> tuple[Shape, _RootAnswer]:
        identity = _identity(answer)
        epoch, expires_at = _epoch_and_expiry(answer, "expires_at", asked)
        if (answer["attribute"], answer["transport_key"]) != (
                credential.attribute, base64.b64encode(transport_key).decode("ascii")):
            raise _BadAnswer("it certifies another attribute or transport key")
        certificate = RootCertificate(credential.attribute, transport_key, epoch, expires_at,
                                      b"")
        partial = T.decode_partial_signature(self.group, _decoded(answer["certificate"]))
        share = T.decode_token_share(self.group, _decoded(answer["routing_token"]))
        _check_index(index, partial.index)
        _check_index(index, share.index)
        if not T.verify_partial_signature(self.group, self.tpk, root_certificate_message(
                credential.attribute, transport_key, epoch, expires_at), partial):
            raise _BadAnswer("its certificate signature does not verify against the "
                             "deployment's public key")
        if not T.verify_token_share(self.pp, self.tpk, share, identity, epoch, credential):
            raise _BadAnswer("its token share does not verify against the deployment's "
                             "public key")
        epoch_end = _epoch_end(answer, expires_at)
        return ((epoch, expires_at, identity, epoch_end),
                _RootAnswer(certificate, partial, share, epoch_end))

    def _link(self, links: T.QuorumSigners, link_key: bytes, encoded: str,
              addresses: tuple[str, ...], index: int, answer: Any
              ) -> tuple[Shape, tuple[tuple[PeerBinding, float, int], bytes]]:
        epoch, not_after = _epoch_and_expiry(answer, "not_after", None)
        role, attributes = answer["role"], answer["attributes"]
        if (answer["public_key"], answer["addresses"]) != (encoded, list(addresses)):
            raise _BadAnswer("it certifies another link key or other addresses")
        if role not in ROLES or not isinstance(attributes, list) or not all(
                isinstance(a, str) for a in attributes):
            raise _BadAnswer("its role or attributes are not a binding's")
        binding = PeerBinding(_identity(answer), role, addresses, tuple(attributes), epoch)
        signature = _decoded(answer["signature"])
        if not Ed25519Server(links.member_keys[index]).verify(links.scope + peer_link_message(
                link_key, binding.to_bytes(), not_after), signature):
            raise _BadAnswer("its signature of the link key does not verify against its "
                             "member key")
        epoch_end = _epoch_end(answer, not_after)
        return ((epoch, not_after, binding.to_bytes(), epoch_end),
                ((binding, epoch_end, not_after), signature))

    def _members(self, index: int, answer: Any
                 ) -> tuple[Shape, tuple[dict[int, bytes], T.PartialSignature]]:
        keys = {entry["index"]: _decoded(entry["key"]) for entry in answer["members"]}
        if sorted(keys) != list(range(1, self.tpk.n + 1)) or any(
                len(key) != ED25519_KEY_BYTES for key in keys.values()):
            raise _BadAnswer(f"its member list is not {self.tpk.n} Ed25519 keys")
        partial = T.decode_partial_signature(self.group, _decoded(answer["signature"]))
        _check_index(index, partial.index)
        if not T.verify_partial_signature(self.group, self.tpk, T.members_message(
                self.tpk, keys), partial):
            raise _BadAnswer("its signature of the member keys does not verify against the "
                             "deployment's public key")
        return (0, tuple(sorted(keys.items()))), (keys, partial)

    def _schema(self, index: int, answer: Any) -> tuple[Shape, tuple[Schema, T.PartialSignature]]:
        schema = Schema.from_dict(answer["schema"])
        partial = T.decode_partial_signature(self.group, _decoded(answer["signature"]))
        _check_index(index, partial.index)
        if not T.verify_partial_signature(self.group, self.tpk, schema_message(schema),
                                          partial):
            raise _BadAnswer("its schema signature does not verify against the deployment's "
                             "public key")
        return (0, schema.canonical_bytes()), (schema, partial)

    # -- asking members until t agree ---------------------------------------------------------

    async def _ask(self, member: MemberAccess, path: str, body: dict[str, Any] | None,
                   limit: int, method: str | None = None) -> Any:
        """The member's JSON answer, read up to ``limit`` bytes: to a POST of ``body`` with
        this identity's token, to a GET of a public route (``body`` and ``method`` None),
        or to ``method`` with the token (``None`` for an answer without a body)."""
        data = bytearray()
        request: dict[str, Any] = {"method": "GET"}
        if body is not None or method is not None:
            request = {"method": method or "POST",
                       "headers": {"Authorization": f"Bearer {member.token}"}}
            if body is not None:
                request["content"] = json.dumps(body).encode("ascii")
                request["headers"]["content-type"] = "application/json"
        try:
            async with self._http.stream(url=member.url.rstrip("/") + path,
                                         **request) as response:
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise _BadAnswer(f"its answer exceeds {limit} bytes")
        except httpx.TransportError as exc:
            reason, down = transport_failure(exc)
            error = _BadAnswer(f"unreachable at {member.url}: {reason}")
            error.code = UNREACHABLE if down else None
            raise error from exc
        except httpx.HTTPError as exc:
            raise _BadAnswer(f"unreachable at {member.url}: {exc!r}") from exc
        try:
            answer = json.loads(data)
        except ValueError:
            answer = data.decode("utf-8", "replace")
        if response.status_code >= 400:
            refusal = KeyServerRequestError(response.status_code, answer)
            error = _BadAnswer(str(refusal))
            error.code = UNREACHABLE if refusal.down else refusal.code
            raise error
        return answer

    async def _answer(self, member: MemberAccess, path: str, body: dict[str, Any] | None,
                      read: Callable[[int, Any], Outcome], limit: int,
                      method: str | None = None) -> Failure | Outcome:
        """The member's verified share, or why there is none: whatever a member answers,
        however slowly, fails that member only."""
        started = time.monotonic()
        try:
            answer = await asyncio.wait_for(self._ask(member, path, body, limit, method),
                                            self.timeout)
            outcome = await asyncio.to_thread(read, member.index, answer)
            self._answer_times.append(time.monotonic() - started)
            return outcome
        except _BadAnswer as exc:  # its text may quote the member's
            return Failure(member.index, str(exc)[:MAX_REASON], exc.code)
        except TimeoutError:
            return Failure(member.index, f"no answer within {self.timeout:g} s", UNREACHABLE)
        except Exception as exc:  # a hostile answer: JSON too deep, an overflow, a bad point
            return Failure(member.index, f"its answer is not a share: {exc!r}"[:MAX_REASON])

    def _hedge_delay(self) -> float:
        """``hedge``, or twice the median time of this client's recent answers when that
        is longer: where every member is slow (a saturated deployment), asking one more
        adds work that is thrown away, not an earlier answer."""
        if not self._answer_times:
            return self.hedge
        return max(self.hedge, 2 * statistics.median(self._answer_times))

    def _order(self) -> deque[MemberAccess]:
        members = list(self.members)
        if self.spread:
            random.shuffle(members)
        return deque(members)

    async def _collect(self, path: str, body: dict[str, Any] | None,
                       read: Callable[[int, Any], tuple[Shape, Share]],
                       describe: Callable[[Shape], str] = lambda shape:
                       f"share (epoch {shape[0]}) agrees",
                       agreed: str = "the epoch, credentials and identity",
                       limit: int = MAX_ANSWER_BYTES, everyone: bool = False,
                       needed: int | None = None) -> _Collected[Share]:
        """Ask ``t`` members at once; ask one more for each that fails or disagrees, and
        one more whenever no member answered for the hedge delay, until ``t`` verified
        shares agree on the epoch and credentials. Every member is asked the same request,
        so an answer for another epoch or other credentials only forms a group of its own
        and steers nobody. A member whose share is of an older epoch than another's (an
        epoch boundary between two answers) is asked once more when no other is left.
        With ``everyone``, every member is asked at once, and once ``t`` agree the others
        are given the hedge delay to answer too (for requests that claim something at
        each member). ``needed`` members must agree where that is more than ``t``."""
        t, waiting = needed or self.tpk.t, self._order()
        loop = asyncio.get_running_loop()
        settle_by: float | None = None
        by_index = {m.index: m for m in self.members}
        groups: dict[Shape, dict[int, Share]] = {}
        failures: list[Failure] = []
        running: dict[asyncio.Task[Any], MemberAccess] = {}
        asked_again: set[int] = set()

        def ask(member: MemberAccess) -> None:
            running[asyncio.create_task(self._answer(member, path, body, read,
                                                     limit))] = member

        def spare() -> MemberAccess | None:
            if waiting:
                return waiting.popleft()
            newest = max((shape[0] for shape in groups), default=None)
            for shape, shares in groups.items():
                older = [i for i in shares if shape[0] != newest and i not in asked_again]
                if older:
                    asked_again.add(older[0])
                    del shares[older[0]]
                    return by_index[older[0]]
            return None

        def disagreeing(chosen: Shape | None) -> list[Failure]:
            return [Failure(i, f"its {describe(shape)} with fewer than {t} members' on "
                               f"{agreed}")
                    for shape, shares in groups.items() if shape != chosen for i in shares]

        for _ in range(len(waiting) if everyone else t):
            ask(waiting.popleft())
        try:
            while running:
                wait = self._hedge_delay() if settle_by is None else settle_by - loop.time()
                done, _ = await asyncio.wait(running, timeout=max(0.0, wait),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done and settle_by is None and (member := spare()) is not None:
                    ask(member)
                for task in done:
                    member = running.pop(task)
                    outcome = task.result()
                    if isinstance(outcome, Failure):
                        failures.append(outcome)
                    else:
                        groups.setdefault(outcome[0], {})[member.index] = outcome[1]
                chosen, best = max(groups.items(), key=lambda g: len(g[1]), default=(None, {}))
                if len(best) >= t and everyone and running:
                    settle_by = settle_by or loop.time() + self.hedge
                    if loop.time() < settle_by:
                        continue
                if len(best) >= t:
                    failures += disagreeing(chosen) + [
                        Failure(m.index, f"it had not answered when {t} others agreed")
                        for m in running.values()]
                    self._report(failures)
                    return _Collected(dict(sorted(best.items())[:t]), failures)
                for _ in range(t - len(best) - len(running)):
                    if (member := spare()) is None:
                        break
                    ask(member)
        finally:
            for task in running:
                task.cancel()
        failures += disagreeing(max(groups, key=lambda shape: len(groups[shape]), default=None))
        self._report(failures)
        raise _no_agreement(t, failures)

    def _report(self, failures: Sequence[Failure]) -> None:
        """A warning for each member that failed, unless it was warned about less than
        ``WARN_GAP`` ago, or failed the same way (with the same error code, or none) when
        last warned about, less than ``REWARN_SECONDS`` ago: a member that is down fails
        every call until it is back, and a hostile one may vary its reasons and codes. The
        others are logged at debug level; all are in the result."""
        now = time.monotonic()
        for failure in failures:
            kind = failure.code or ""
            last = self._warned.get(failure.index)
            quiet = last is not None and (now - last[1] < WARN_GAP or (
                last[0] == kind and now - last[1] < REWARN_SECONDS))
            if not quiet:
                self._warned[failure.index] = (kind, now)
            log.log(logging.DEBUG if quiet else logging.WARNING, "threshold member %d: %s",
                    failure.index, failure.reason)


def _decoded(text: Any) -> bytes:
    if not isinstance(text, str):
        raise _BadAnswer("its answer holds no base64 share")
    return base64.b64decode(text, validate=True)


def _identity(answer: Any) -> str:
    """The identity a member says it answered for: its shares are checked under it, and
    only shares of one identity combine."""
    identity = answer["identity"]
    if not isinstance(identity, str) or not 0 < len(identity) <= MAX_IDENTITY:
        raise _BadAnswer("its identity is not a name")
    return identity


def max_answer_bytes(schema: Schema) -> int:
    """The most a member's answer to a subscriber's enrolment may hold under ``schema``:
    ``MAX_ANSWER_BYTES`` and, in base64, a connection request of its largest attribute per
    credential and a fine token of its longest path per fine credential (a path has at most
    ``positions`` characters of up to 4 bytes). Other answers carry neither and are held
    to ``MAX_ANSWER_BYTES``."""
    request = max(REQUEST_BYTES + 4 * len(a.name.encode()) + a.positions * REQUEST_ENTRY_BYTES
                  for a in schema.attributes)
    token = max(TOKEN_BYTES + 4 * len(a.name.encode()) + 4 * a.positions
                for a in schema.attributes)
    return MAX_ANSWER_BYTES + 4 * (MAX_CREDENTIALS * request + MAX_FINE_CREDENTIALS * token) // 3


def _signed_requests(answer: Any, credentials: Sequence[Credential]
                     ) -> list[tuple[bytes, bytes]]:
    """Each credential's connection request body and partial signature, in the credentials'
    order."""
    signatures = answer.get("request_signatures")
    if not isinstance(signatures, list) or len(signatures) != len(credentials):
        raise _BadAnswer("it answered no signature of the connection requests for "
                         f"{len(credentials)} credentials")
    by_label = {s["credential"]: s for s in signatures if isinstance(s, dict)}
    missing = [c.label() for c in credentials if c.label() not in by_label]
    if missing:
        raise _BadAnswer(f"it signed no connection request for {missing[0]}")
    if any(not isinstance(by_label[c.label()].get("request"), str) for c in credentials):
        raise _BadAnswer("it answered no connection request bodies with its signatures (a "
                         "member of an earlier release than this client)")
    return [(_decoded(by_label[c.label()]["request"]),
             _decoded(by_label[c.label()].get("signature"))) for c in credentials]


def _epoch_and_expiry(answer: Any, expiry: str, asked: str | int | None) -> tuple[int, int]:
    """A member's epoch and the expiry it signed (its field ``expiry``): whole numbers, the
    epoch asked for when one was, the expiry still ahead."""
    epoch, expires_at = answer["epoch"], answer[expiry]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63
               for v in (epoch, expires_at)):
        raise _BadAnswer(f"its epoch or {expiry} is not a number")
    if isinstance(asked, int) and epoch != asked:
        raise _BadAnswer(f"it answered for epoch {epoch}, not the {asked} asked for")
    if expires_at <= time.time():
        raise _BadAnswer("what it signed has expired")
    return epoch, expires_at


def _epoch_end(answer: Any, expires_at: int) -> float:
    """When a member says the epoch of its answer ends: a time, and not after the expiry
    it signed. Members must agree on it (it is part of each answer's shape), since a peer
    renews its keys in the grace between the two."""
    end = answer["epoch_end"]
    if (not isinstance(end, int | float) or isinstance(end, bool)
            or not 0 < end <= expires_at):
        raise _BadAnswer("its epoch_end is not a time before the expiry it signed")
    return float(end)


def _check_index(asked: int, answered: int) -> None:
    if answered != asked:
        raise _BadAnswer(f"it answered with member {answered}'s share")


def _check_count(keys: int, most: int = MAX_KEYS) -> None:
    if keys > most:
        raise _BadAnswer(f"it answered {keys} keys, more than an enrolment has ({most})")
