"""The threshold key service (docs/scheme.md, version 3): key shares from ``t`` of ``n``
servers, each publicly checkable, combined by the client into version-2 keys; and threshold
BLS signatures in place of the single server's Ed25519 key.

Nobody forms ``alpha`` or ``beta``. With ``delta = alpha / beta``, ``W = g2^beta`` and
``G = g2^(1/beta)`` (from :mod:`credentials.ceremony`):
``g2^alpha = W^delta`` and ``D = g2^((gamma_s + alpha) / beta) = G^gamma_s * g2^delta``, so
only ``delta``, ``phi`` and the signing key ``x`` are secret-shared (by
:mod:`credentials.dkg`). Events, routing, decryption and verification are version 2's:
a combined key is a :class:`SubscriberKey` or :class:`PublisherKey` like any other.

Server ``i`` draws its per-key randomness from a PRF of its own, so asking again returns
the same share. Shares of one subscriber's keys must all be combined over the same set of
``t`` servers: the binding ``gamma_s = sum lambda_i gamma_s_i`` depends on the set.

**A change to the draft of version 3.** The draft derived ``gamma_s_i = PRF_i(identity,
epoch)``: one binding for every key an identity receives in an epoch. Version 2 draws a
fresh ``gamma_s`` per issuance, and that matters when an identity's policy changes
within an epoch: keys issued under the old policy and under the new one would share
``gamma_s`` and combine, credential by credential, into keys that neither policy allows
(``symbol = IBM`` from the first with ``price < 200`` from the second; the test suite
shows it). Here the binding is per *issuance*: ``gamma_s_i`` and every ``gamma_i`` also
take the digest of the exact credential lists issued (:func:`issuance_digest`), so asking
again for the same keys returns the same shares (what the fallback to another server
needs), and any other request gets an independent binding, as in version 2.

**Shares are bound to their identity** by a sharing of zero, ``rho`` (``rho(0) = 0``):
member ``i`` multiplies ``D_i`` by ``H(identity, I)^rho_i``, each routing token's ``T_i``
by ``H(identity, I, credential)^rho_i`` and ``P1_i`` by ``H(identity, credential)^rho_i``.
Over ``t`` shares of one identity and issuance the factors combine to ``H^0 = 1``;
shares issued to different identities leave ``(H_A / H_B)^c`` with ``c`` a combination
of ``rho_i`` nobody knows, so identities that each get fewer than ``t`` shares cannot
pool them into a key or a routing token (without it they could: docs/scheme.md, section
16.8).
"""

from __future__ import annotations

import functools
import hashlib
import secrets as system_random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ibe_pubsub.credentials.ceremony import BetaState
from ibe_pubsub.credentials.codec import (
    SIGNATURE_BYTES,
    TAG_MEMBER_KEYS,
    TAG_PARTIAL_SIGNATURE,
    TAG_PUBLISHER_KEY_SHARE,
    TAG_QUORUM_SIGNATURE,
    TAG_SUBSCRIBER_KEY_SHARE,
    TAG_THRESHOLD_PUBLIC_KEY,
    TAG_TOKEN_SHARE,
    CodecError,
    Reader,
    Writer,
    decode_mpk,
    decode_publisher_key,
    decode_routing_token,
    decode_subscriber_key,
    encode_mpk,
    encode_publisher_key,
    encode_request_body,
    encode_routing_token,
    encode_subscriber_key,
)
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G1, G2, GT, Element, GroupError, PairingGroup
from ibe_pubsub.credentials.keys import (
    MasterPublicKey,
    PublisherKey,
    RoutingToken,
    SubscriberCredentialKey,
    SubscriberKey,
)
from ibe_pubsub.credentials.messages import ConnectionRequest
from ibe_pubsub.credentials.scheme import (
    PUB,
    SUB,
    PublicParams,
    derive_connection_request,
    identity_string,
)
from ibe_pubsub.credentials.server_keys import Ed25519Server
from ibe_pubsub.credentials.shamir import lagrange_at, lagrange_at_zero
from ibe_pubsub.credentials.symmetric import prf_scalar

#: Weights of the small-exponent batch test of a share's equations: a wrong share passes
#: with probability at most 2^-63.
BATCH_WEIGHT_BITS = 64

#: Domain tags: g2 from the deployment's label, and the key service's signed messages
#: (kept apart from the events' M, so no signature of one kind is ever one of the other).
DST_G2 = b"IBE-PUBSUB-V3-G2"
DST_SIGNATURE = b"IBE-PUBSUB-V3-SIG"
DST_IDENTITY = b"IBE-PUBSUB-V3-RHO"


class ThresholdError(CredentialsError, ValueError):
    """Shares that cannot be combined: too few, a repeated server, mixed keys or epochs."""


def derive_g2(group: PairingGroup, deployment: bytes) -> Element:
    """``g2 = H(deployment)`` onto G1: a point whose discrete logarithm nobody knows."""
    return group.hash_to_g1(deployment, DST_G2)


@dataclass(frozen=True)
class ThresholdPublicKey:
    """What every client of a deployment holds: the version-2 MPK (peers use only it), and
    ``W``, ``G``, ``X = ĝ^x`` and each server's public shares ``ĝ^delta_i``, ``ĝ^phi_i``,
    ``ĝ^x_i``, ``ĝ^rho_i`` (index i = server number, 1..n), which make every share
    checkable."""

    deployment: bytes
    t: int
    n: int
    mpk: MasterPublicKey
    W: Element
    G: Element
    X: Element
    delta_shares: Mapping[int, Element]
    phi_shares: Mapping[int, Element]
    x_shares: Mapping[int, Element]
    rho_shares: Mapping[int, Element]


def assemble_public_key(group: PairingGroup, deployment: bytes, t: int, n: int,
                        beta: BetaState, delta_key: Element,
                        delta_shares: Mapping[int, Element], phi_key: Element,
                        phi_shares: Mapping[int, Element], x_key: Element,
                        x_shares: Mapping[int, Element], rho_shares: Mapping[int, Element]
                        ) -> ThresholdPublicKey:
    """From the ceremony's last state and the four key generations' public outputs:
    ``h = ĝ^phi``, ``hd`` from the ceremony, ``Y = e(W, ĝ^delta)`` (= e(g2, ĝ)^alpha).
    Refuses public shares that do not lie on one polynomial of degree below ``t`` through
    their key (the identity for ``rho``), and identity elements."""
    for name, key, shares in (("delta", delta_key, delta_shares), ("phi", phi_key, phi_shares),
                              ("x", x_key, x_shares)):
        check_public_shares(group, t, n, key, shares, name)
    check_public_shares(group, t, n, group.identity(G2), rho_shares, "rho", zero=True)
    if any(bytes(e) == bytes(group.identity(e.kind)) for e in (beta.W, beta.G, beta.hd)):
        raise ThresholdError("the ceremony's points include the identity")
    g2 = derive_g2(group, deployment)
    mpk = MasterPublicKey(curve=group.curve, g=group.generator(G1),
                          g_hat=group.generator(G2), g2=g2, h=phi_key, hd=beta.hd,
                          Y=group.pair(beta.W, delta_key))
    return ThresholdPublicKey(deployment, t, n, mpk, beta.W, beta.G, x_key,
                              dict(delta_shares), dict(phi_shares), dict(x_shares),
                              dict(rho_shares))


def encode_public_key(tpk: ThresholdPublicKey) -> bytes:
    """Tag 18 (docs/wire-format.md): the deployment, ``t``, ``n``, the MPK, ``W``, ``G``,
    ``X``, then each server's ``ĝ^delta_i``, ``ĝ^phi_i``, ``ĝ^x_i``, ``ĝ^rho_i`` in server
    order."""
    w = (Writer(TAG_THRESHOLD_PUBLIC_KEY).blob(tpk.deployment).u8(tpk.t).u8(tpk.n)
         .blob(encode_mpk(tpk.mpk)).element(tpk.W).element(tpk.G).element(tpk.X))
    for i in range(1, tpk.n + 1):
        w.element(tpk.delta_shares[i]).element(tpk.phi_shares[i]).element(tpk.x_shares[i])
        w.element(tpk.rho_shares[i])
    return w.done()


def decode_public_key(group: PairingGroup, data: bytes) -> ThresholdPublicKey:
    """The inverse of :func:`encode_public_key`, refusing public shares that do not lie on
    one polynomial through their key (``rho``'s through the identity) and an ``Y`` other
    than ``e(W, ĝ^delta)``."""
    r = Reader(group, data, TAG_THRESHOLD_PUBLIC_KEY, "threshold public key")
    deployment, t, n = r.blob(), r.u8(), r.u8()
    mpk = decode_mpk(group, r.blob())
    W, G, X = r.element(G1), r.element(G1), r.element(G2)
    shares = [tuple(r.element(G2) for _ in range(4)) for _ in range(n)]
    r.end()
    delta, phi, x, rho = ({i: s[k] for i, s in enumerate(shares, start=1)} for k in range(4))
    try:
        for name, key, public in (("phi", mpk.h, phi), ("x", X, x)):
            check_public_shares(group, t, n, key, public, name)
        check_public_shares(group, t, n, group.identity(G2), rho, "rho", zero=True)
        delta_key = _interpolated_key(group, t, delta)
        check_public_shares(group, t, n, delta_key, delta, "delta")
    except ThresholdError as exc:
        raise CodecError(f"threshold public key: {exc}") from exc
    if (group.pair(W, delta_key) != mpk.Y or mpk.g2 != derive_g2(group, deployment)
            or not _holds(group, (W, mpk.g_hat), (~mpk.g2, mpk.hd))
            or not _holds(group, (G, mpk.hd), (~mpk.g2, mpk.g_hat))):
        raise CodecError("threshold public key: Y, g2, W or G does not match the deployment")
    return ThresholdPublicKey(deployment, t, n, mpk, W, G, X, delta, phi, x, rho)


def check_public_shares(group: PairingGroup, t: int, n: int, key: Element,
                        shares: Mapping[int, Element], name: str = "key",
                        zero: bool = False) -> None:
    """Every ``ĝ^(f(j))`` of 1..n, and ``ĝ^(f(0))`` = ``key``, interpolated in the exponent
    from those of servers 1..t, so that any ``t`` servers' partial results combine to the
    same value; no share the identity, and the key the identity exactly when ``zero`` (a
    sharing of zero)."""
    if sorted(shares) != list(range(1, n + 1)) or not 0 < t <= n:
        raise ThresholdError(f"{name}: need the public shares of servers 1..{n}")
    identity = group.identity(key.kind)
    if (key == identity) is not zero:
        raise ThresholdError(f"{name}: the public key must {'' if zero else 'not '}be the "
                             "identity")
    if identity in shares.values():
        raise ThresholdError(f"{name}: a public share is the identity")
    base = list(range(1, t + 1))
    for j, expected in [(0, key), *((j, shares[j]) for j in range(t + 1, n + 1))]:
        weights = lagrange_at(base, j, group.order)
        if group.multi_exp([shares[i] for i in base], [weights[i] for i in base]) != expected:
            raise ThresholdError(f"{name}: the public shares do not lie on one polynomial "
                                 f"of degree below {t} through the public key")


def _interpolated_key(group: PairingGroup, t: int, shares: Mapping[int, Element]) -> Element:
    """``ĝ^(f(0))`` from the public shares of servers 1..t."""
    weights = lagrange_at_zero(range(1, t + 1), group.order)
    return group.multi_exp([shares[i] for i in weights], list(weights.values()))


def _check_new_shares(group: PairingGroup, old: ThresholdPublicKey, t: int, n: int,
                      delta_shares: Mapping[int, Element], phi_shares: Mapping[int, Element],
                      x_shares: Mapping[int, Element], rho_shares: Mapping[int, Element]
                      ) -> None:
    """A new set as the set-up's plan allows one (:func:`allowed_set`) whose sharings
    each lie on one polynomial of degree below ``t`` through ``old``'s key."""
    if not allowed_set(t, n):
        raise ThresholdError(f"a new set needs t >= 2 and 2t - 1 <= n <= {MAX_SERVERS}, got "
                             f"t={t}, n={n}")
    for name, key, shares in (("delta", _interpolated_key(group, old.t, old.delta_shares),
                               delta_shares), ("phi", old.mpk.h, phi_shares),
                              ("x", old.X, x_shares)):
        check_public_shares(group, t, n, key, shares, name)
    check_public_shares(group, t, n, group.identity(G2), rho_shares, "rho", zero=True)


def reshared_public_key(group: PairingGroup, old: ThresholdPublicKey, t: int, n: int,
                        delta_shares: Mapping[int, Element], phi_shares: Mapping[int, Element],
                        x_shares: Mapping[int, Element], rho_shares: Mapping[int, Element]
                        ) -> ThresholdPublicKey:
    """The public key of a new set of ``n`` servers with threshold ``t`` after a resharing
    (``credentials.resharing``): ``old``'s deployment, MPK, ``W``, ``G`` and ``X`` with the
    new public shares, refused unless each new sharing lies on one polynomial of degree
    below ``t`` through the old key (``ĝ^delta``, ``h``, ``X``; the identity for ``rho``)."""
    _check_new_shares(group, old, t, n, delta_shares, phi_shares, x_shares, rho_shares)
    return replace(old, t=t, n=n, delta_shares=dict(delta_shares),
                   phi_shares=dict(phi_shares), x_shares=dict(x_shares),
                   rho_shares=dict(rho_shares))


RESHARE_TAG = b"ibe-pubsub/v3/reshared-key"
#: Servers a public key can number (its encoding writes ``n`` in one byte).
MAX_SERVERS = 255


def allowed_set(t: int, n: int) -> bool:
    """Whether a set of ``n`` servers at threshold ``t`` may take over a deployment's keys:
    ``t >= 2`` (at 1 each server would hold the secrets) and ``2t - 1 <= n <=
    MAX_SERVERS``."""
    return t >= 2 and 2 * t - 1 <= n <= MAX_SERVERS


def reshare_message(previous: ThresholdPublicKey, new: ThresholdPublicKey, generation: int
                    ) -> bytes:
    """What ``t`` servers sign with their shares of ``x`` so that clients holding
    ``previous`` take ``new``, the set that replaces it: tag 25, the label, the
    resharing's ``generation`` (``u64``, 1 for the first after the set-up), the SHA-256
    of ``previous``'s encoding and ``new``'s encoding. Old and new shares of ``x`` sign
    alike (both give ``M^x``)."""
    return (Writer(TAG_MEMBER_KEYS).blob(RESHARE_TAG).u64(generation)
            .blob(hashlib.sha256(encode_public_key(previous)).digest())
            .blob(encode_public_key(new)).done())


def accept_reshared(group: PairingGroup, held: ThresholdPublicKey, held_generation: int,
                    new: ThresholdPublicKey, generation: int, signature: Element) -> bool:
    """Does a client holding ``held`` (of ``held_generation``, 0 for the set-up's) take
    ``new``: the next generation, signed under ``X`` as the successor of ``held``, of the
    same deployment (its id, MPK, ``W``, ``G`` and ``X``), with public shares that lie on
    polynomials through the same keys? One generation at a time, each naming the one it
    replaces, so an older set (one a removed server was part of) cannot be brought back
    and no generation can be skipped over with a key that does not follow from it."""
    if (generation != held_generation + 1 or not 0 < generation < 1 << 64
            or new.deployment != held.deployment
            or encode_mpk(new.mpk) != encode_mpk(held.mpk)
            or (new.W, new.G, new.X) != (held.W, held.G, held.X)):
        return False
    try:
        _check_new_shares(group, held, new.t, new.n, new.delta_shares, new.phi_shares,
                          new.x_shares, new.rho_shares)
    except ThresholdError:
        return False
    return verify_signature(group, held.X, reshare_message(held, new, generation), signature)


@dataclass(frozen=True)
class ServerSecrets:
    """Server ``index``'s secret shares ``delta_i``, ``phi_i``, ``x_i``, ``rho_i`` and its
    PRF key."""

    index: int
    delta: int
    phi: int
    x: int
    rho: int
    prf_key: bytes

    def __repr__(self) -> str:
        return f"ServerSecrets(index={self.index}, ...)"


def _epoch(epoch: int) -> bytes:
    return epoch.to_bytes(8, "big")


@functools.lru_cache(maxsize=4096)
def identity_point(group: PairingGroup, identity: str, issuance: bytes) -> Element:
    """``H(identity, issuance)`` onto G1 (domain tag ``IBE-PUBSUB-V3-RHO``): raised to
    ``rho_i`` in member ``i``'s share, it binds the share to the identity it was issued
    to. Cached: a client checks the shares of ``t`` members against the same points."""
    who = identity.encode()
    return group.hash_to_g1(len(who).to_bytes(4, "big") + who + issuance, DST_IDENTITY)


# -- Key shares --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SubscriberKeyShare:
    """Server ``index``'s share of a subscriber's keys: ``D_i``, ``Gamma_i = ĝ^gamma_s_i``
    (to check it), and per credential ``(S1_i, S2_i, T_i)``, with the fine tokens' ``T_i``."""

    index: int
    key: SubscriberKey
    Gamma: Element


@dataclass(frozen=True)
class PublisherKeyShare:
    """Server ``index``'s share ``(P1_i, P2_i)`` of a publisher's key for one credential."""

    index: int
    key: PublisherKey


@dataclass(frozen=True)
class TokenShare:
    """Server ``index``'s share ``T_i`` of one routing token: a root's whole-domain token,
    issued alone (a root holds no ``D``, ``S1`` or ``S2``)."""

    index: int
    token: RoutingToken


def encode_subscriber_share(share: SubscriberKeyShare) -> bytes:
    """Tag 19: the server's index, the share as a subscriber key (5.6), ``Gamma_i``."""
    return (Writer(TAG_SUBSCRIBER_KEY_SHARE).u8(share.index)
            .blob(encode_subscriber_key(share.key)).element(share.Gamma).done())


def decode_subscriber_share(group: PairingGroup, data: bytes) -> SubscriberKeyShare:
    r = Reader(group, data, TAG_SUBSCRIBER_KEY_SHARE, "subscriber key share")
    share = SubscriberKeyShare(r.u8(), decode_subscriber_key(group, r.blob()), r.element(G2))
    r.end()
    return share


def encode_publisher_share(share: PublisherKeyShare) -> bytes:
    """Tag 20: the server's index and the share as a publisher key (5.3)."""
    return (Writer(TAG_PUBLISHER_KEY_SHARE).u8(share.index)
            .blob(encode_publisher_key(share.key)).done())


def decode_publisher_share(group: PairingGroup, data: bytes) -> PublisherKeyShare:
    r = Reader(group, data, TAG_PUBLISHER_KEY_SHARE, "publisher key share")
    share = PublisherKeyShare(r.u8(), decode_publisher_key(group, r.blob()))
    r.end()
    return share


def encode_token_share(share: TokenShare) -> bytes:
    """Tag 23: the server's index and the share as a routing token (5.4)."""
    return Writer(TAG_TOKEN_SHARE).u8(share.index).blob(encode_routing_token(share.token)).done()


def decode_token_share(group: PairingGroup, data: bytes) -> TokenShare:
    r = Reader(group, data, TAG_TOKEN_SHARE, "routing token share")
    share = TokenShare(r.u8(), decode_routing_token(group, r.blob()))
    r.end()
    return share


def issuance_digest(epoch: int, credentials: Sequence[Credential],
                    fine_credentials: Sequence[Credential]) -> bytes:
    """SHA-256 of the epoch and the identity strings of every credential issued, in order,
    then of the fine credentials: what makes one subscriber issuance's binding its own."""
    digest = hashlib.sha256(b"IBE-PUBSUB-V3-ISSUANCE" + _epoch(epoch))
    for part, listed in ((b"credentials", credentials), (b"fine", fine_credentials)):
        digest.update(part + len(listed).to_bytes(4, "big"))
        for c in listed:
            name = identity_string(c.attribute, SUB, epoch, c)
            digest.update(len(name).to_bytes(4, "big") + name)
    return digest.digest()


def keyshare_subscriber(pp: PublicParams, tpk: ThresholdPublicKey, secrets: ServerSecrets,
                        identity: str, epoch: int, credentials: Sequence[Credential],
                        fine_credentials: Sequence[Credential] = ()) -> SubscriberKeyShare:
    """With ``I`` the issuance digest, ``gamma_s_i = PRF_i("gamma_s", identity, I)`` and
    ``gamma_i = PRF_i(SUB, identity, I, credential)``:
    ``D_i = G^gamma_s_i * g2^delta_i * H(identity, I)^rho_i``, ``Gamma_i = ĝ^gamma_s_i``;
    per credential ``S1_i = g2^gamma_s_i * F^gamma_i``, ``S2_i = ĝ^gamma_i``,
    ``T_i = F^phi_i * H(identity, I, credential)^rho_i`` (fine tokens' ``T_i`` likewise)."""
    group, g2, g_hat = pp.group, tpk.mpk.g2, tpk.mpk.g_hat
    who = identity.encode()
    issuance = issuance_digest(epoch, credentials, fine_credentials)
    gamma_s = prf_scalar(group, secrets.prf_key, b"gamma_s", who, issuance)
    D = (group.exp_secret(tpk.G, gamma_s) * group.exp_secret(g2, secrets.delta)
         * group.exp_secret(identity_point(group, identity, issuance), secrets.rho))

    def token(F: Element, name: bytes) -> Element:
        return _token_share(group, secrets, F, identity, issuance + name)

    g2_gamma_s = group.exp_secret(g2, gamma_s)
    keys = []
    for c in credentials:
        name = identity_string(c.attribute, SUB, epoch, c)
        gamma = prf_scalar(group, secrets.prf_key, SUB.encode(), who, issuance, name)
        F = pp.F(name)
        keys.append(SubscriberCredentialKey(
            credential=c, epoch=epoch, S1=g2_gamma_s * group.exp_secret(F, gamma),
            S2=group.exp_secret(g_hat, gamma), T=token(F, name)))
    fine = []
    for c in fine_credentials:
        name = identity_string(c.attribute, SUB, epoch, c)
        fine.append(RoutingToken(c, epoch, token(pp.F(name), name)))
    return SubscriberKeyShare(secrets.index, SubscriberKey(epoch, D, tuple(keys), tuple(fine)),
                              group.exp_secret(g_hat, gamma_s))


def _token_share(group: PairingGroup, secrets: ServerSecrets, F: Element, identity: str,
                 binding: bytes) -> Element:
    """``T_i = F^phi_i * H(identity, binding)^rho_i``."""
    return group.exp_secret(F, secrets.phi) * group.exp_secret(
        identity_point(group, identity, binding), secrets.rho)


def _lone_token(epoch: int, credential: Credential) -> tuple[bytes, bytes]:
    """A token issued alone: its credential's identity string ``name``, and what binds its
    ``rho`` term, ``I || name`` with ``I`` the issuance digest of no credential and this
    one fine credential."""
    name = identity_string(credential.attribute, SUB, epoch, credential)
    return name, issuance_digest(epoch, (), (credential,)) + name


def keyshare_token(pp: PublicParams, tpk: ThresholdPublicKey, secrets: ServerSecrets,
                   identity: str, epoch: int, credential: Credential) -> TokenShare:
    """A routing token issued alone (a root's): with ``I`` the issuance digest of no
    credential and this one fine credential, ``T_i = F^phi_i * H(identity, I, name)^rho_i``,
    the fine token of :func:`keyshare_subscriber` for that issuance."""
    name, binding = _lone_token(epoch, credential)
    return TokenShare(secrets.index, RoutingToken(credential, epoch, _token_share(
        pp.group, secrets, pp.F(name), identity, binding)))


def keyshare_publisher(pp: PublicParams, tpk: ThresholdPublicKey, secrets: ServerSecrets,
                       identity: str, credential: Credential, epoch: int
                       ) -> PublisherKeyShare:
    """``P1_i = W^delta_i * F^gamma_i * H(identity, credential)^rho_i``,
    ``P2_i = ĝ^gamma_i``."""
    group = pp.group
    name = identity_string(credential.attribute, PUB, epoch, credential)
    gamma = prf_scalar(group, secrets.prf_key, PUB.encode(), identity.encode(), name)
    return PublisherKeyShare(secrets.index, PublisherKey(
        credential=credential, epoch=epoch,
        P1=(group.exp_secret(tpk.W, secrets.delta) * group.exp_secret(pp.F(name), gamma)
            * group.exp_secret(identity_point(group, identity, name), secrets.rho)),
        P2=group.exp_secret(tpk.mpk.g_hat, gamma)))


def _holds(group: PairingGroup, *pairs: tuple[Element, Element]) -> bool:
    """``prod e(a, b) == 1`` in GT: one multi-pairing per equation."""
    return group.multi_pair(list(pairs)) == group.identity(GT)


def verify_subscriber_share(pp: PublicParams, tpk: ThresholdPublicKey,
                            share: SubscriberKeyShare, identity: str, epoch: int,
                            credentials: Sequence[Credential],
                            fine_credentials: Sequence[Credential] = ()) -> bool:
    """Is ``share`` server ``share.index``'s answer to this request (``identity``,
    ``epoch``, the credentials, in order), and valid: with ``H = H(identity, I)`` and
    ``H_c = H(identity, I, credential)``,
    ``e(D_i, ĝ) = e(G, Gamma_i) e(g2, ĝ^delta_i) e(H, ĝ^rho_i)``; per credential
    ``e(S1_i, ĝ) = e(g2, Gamma_i) e(F, S2_i)`` and
    ``e(T_i, ĝ) = e(F, ĝ^phi_i) e(H_c, ĝ^rho_i)``; per fine credential the same for its
    ``T_i``? The equations are checked at once, each raised to a random 64-bit weight
    ``w`` (one multi-pairing of 5 + credentials Miller loops):
    ``e(D^w0 prod S1^w prod T^w', ĝ) e(G^-w0 g2^-sum(w), Gamma) e(g2^-w0, ĝ^delta_i)
    e(H^-w0 prod H_c^-w', ĝ^rho_i) prod e(F^-w, S2) e(prod F^-w', ĝ^phi_i) = 1``."""
    group, mpk, key = pp.group, tpk.mpk, share.key
    delta_i, phi_i = tpk.delta_shares.get(share.index), tpk.phi_shares.get(share.index)
    rho_i = tpk.rho_shares.get(share.index)
    if (delta_i is None or phi_i is None or rho_i is None or key.epoch != epoch
            or [k.credential for k in key.credentials] != list(credentials)
            or [f.credential for f in key.fine_tokens] != list(fine_credentials)
            or any(k.epoch != epoch for k in (*key.credentials, *key.fine_tokens))):
        return False
    issuance = issuance_digest(epoch, credentials, fine_credentials)
    w0 = system_random.randbits(BATCH_WEIGHT_BITS) | 1
    on_g_hat, on_g_hat_w = [key.D], [w0]
    on_rho, on_rho_w = [identity_point(group, identity, issuance)], [w0]
    pairs: list[tuple[Element, Element]] = []
    on_phi, on_phi_w, s1_w = [], [], []

    def token(T: Element, name: bytes, w_t: int) -> None:
        on_g_hat.append(T)
        on_g_hat_w.append(w_t)
        on_phi.append(pp.F(name))
        on_phi_w.append(w_t)
        on_rho.append(identity_point(group, identity, issuance + name))
        on_rho_w.append(w_t)

    for k in key.credentials:
        name = identity_string(k.credential.attribute, SUB, epoch, k.credential)
        w, w_t = (system_random.randbits(BATCH_WEIGHT_BITS) | 1 for _ in "st")
        on_g_hat.append(k.S1)
        on_g_hat_w.append(w)
        s1_w.append(w)
        pairs.append((~(pp.F(name) ** w), k.S2))
        token(k.T, name, w_t)
    for fine in key.fine_tokens:
        token(fine.T, identity_string(fine.attribute, SUB, epoch, fine.credential),
              system_random.randbits(BATCH_WEIGHT_BITS) | 1)
    pairs += [(group.multi_exp(on_g_hat, on_g_hat_w), mpk.g_hat),
              (~group.multi_exp([tpk.G, mpk.g2], [w0, sum(s1_w)]), share.Gamma),
              (~(mpk.g2 ** w0), delta_i),
              (~group.multi_exp(on_rho, on_rho_w), rho_i)]
    if on_phi:
        pairs.append((~group.multi_exp(on_phi, on_phi_w), phi_i))
    return _holds(group, *pairs)


def verify_publisher_share(pp: PublicParams, tpk: ThresholdPublicKey,
                           share: PublisherKeyShare, identity: str, credential: Credential,
                           epoch: int) -> bool:
    """Is ``share`` server ``share.index``'s answer for this identity, credential and
    epoch, and valid: ``e(P1_i, ĝ) = e(W, ĝ^delta_i) e(F, P2_i) e(H(identity, credential),
    ĝ^rho_i)``?"""
    delta_i, rho_i, key = (tpk.delta_shares.get(share.index), tpk.rho_shares.get(share.index),
                           share.key)
    if delta_i is None or rho_i is None or (key.credential, key.epoch) != (credential, epoch):
        return False
    name = identity_string(credential.attribute, PUB, epoch, credential)
    return _holds(pp.group, (key.P1, tpk.mpk.g_hat), (~tpk.W, delta_i), (~pp.F(name), key.P2),
                  (~identity_point(pp.group, identity, name), rho_i))


def verify_token_share(pp: PublicParams, tpk: ThresholdPublicKey, share: TokenShare,
                       identity: str, epoch: int, credential: Credential) -> bool:
    """Is ``share`` server ``share.index``'s token for this identity, credential and epoch:
    ``e(T_i, ĝ) = e(F, ĝ^phi_i) e(H(identity, I, name), ĝ^rho_i)``?"""
    phi_i, rho_i, token = (tpk.phi_shares.get(share.index), tpk.rho_shares.get(share.index),
                           share.token)
    if phi_i is None or rho_i is None or (token.credential, token.epoch) != (credential,
                                                                               epoch):
        return False
    name, binding = _lone_token(epoch, credential)
    H = identity_point(pp.group, identity, binding)
    return _holds(pp.group, (token.T, tpk.mpk.g_hat), (~pp.F(name), phi_i), (~H, rho_i))


def _weights(tpk: ThresholdPublicKey, indices: Sequence[int], order: int) -> dict[int, int]:
    """Lagrange weights of exactly ``t`` distinct servers of the deployment."""
    if len(indices) != tpk.t or len(set(indices)) != tpk.t or any(
            not 0 < i <= tpk.n for i in indices):
        raise ThresholdError(f"combining needs the shares of exactly {tpk.t} distinct "
                             f"servers of 1..{tpk.n}, got {sorted(indices)}")
    return lagrange_at_zero(indices, order)


def _combine(group: PairingGroup, elements: Sequence[Element], weights: Sequence[int]
             ) -> Element:
    return group.multi_exp(list(elements), list(weights))


def combine_subscriber_key(pp: PublicParams, tpk: ThresholdPublicKey,
                           shares: Sequence[SubscriberKeyShare]) -> SubscriberKey:
    """``D = prod D_i^lambda_i``, and likewise every ``S1``, ``S2``, ``T``, over one set
    of ``t`` servers whose shares hold the same epoch and credentials, in the same order."""
    group = pp.group
    weights = _weights(tpk, [s.index for s in shares], group.order)
    lambdas = [weights[s.index] for s in shares]
    first = shares[0].key
    shape = (first.epoch, [k.credential for k in first.credentials],
             [f.credential for f in first.fine_tokens])
    for share in shares[1:]:
        key = share.key
        if (key.epoch, [k.credential for k in key.credentials],
                [f.credential for f in key.fine_tokens]) != shape:
            raise ThresholdError("the shares are of different epochs or credentials")
    credentials = tuple(SubscriberCredentialKey(
        credential=k.credential, epoch=first.epoch,
        S1=_combine(group, [s.key.credentials[n].S1 for s in shares], lambdas),
        S2=_combine(group, [s.key.credentials[n].S2 for s in shares], lambdas),
        T=_combine(group, [s.key.credentials[n].T for s in shares], lambdas))
        for n, k in enumerate(first.credentials))
    fine = tuple(RoutingToken(f.credential, first.epoch,
                              _combine(group, [s.key.fine_tokens[n].T for s in shares],
                                       lambdas))
                 for n, f in enumerate(first.fine_tokens))
    return SubscriberKey(first.epoch, _combine(group, [s.key.D for s in shares], lambdas),
                         credentials, fine)


def combine_publisher_key(pp: PublicParams, tpk: ThresholdPublicKey,
                          shares: Sequence[PublisherKeyShare]) -> PublisherKey:
    """``P1 = prod P1_i^lambda_i``, ``P2 = prod P2_i^lambda_i`` over one set of ``t``."""
    group = pp.group
    weights = _weights(tpk, [s.index for s in shares], group.order)
    lambdas = [weights[s.index] for s in shares]
    first = shares[0].key
    if any((s.key.credential, s.key.epoch) != (first.credential, first.epoch)
           for s in shares):
        raise ThresholdError("the shares are of different credentials or epochs")
    return PublisherKey(first.credential, first.epoch,
                        _combine(group, [s.key.P1 for s in shares], lambdas),
                        _combine(group, [s.key.P2 for s in shares], lambdas))


def combine_token(pp: PublicParams, tpk: ThresholdPublicKey, shares: Sequence[TokenShare]
                  ) -> RoutingToken:
    """``T = prod T_i^lambda_i = F^phi`` over one set of ``t`` (the ``rho`` shares of zero
    cancel only there, for shares of one identity and issuance)."""
    group = pp.group
    weights = _weights(tpk, [s.index for s in shares], group.order)
    first = shares[0].token
    if any((s.token.credential, s.token.epoch) != (first.credential, first.epoch)
           for s in shares):
        raise ThresholdError("the shares are of different credentials or epochs")
    return RoutingToken(first.credential, first.epoch, _combine(
        group, [s.token.T for s in shares], [weights[s.index] for s in shares]))


# -- Threshold BLS signatures ------------------------------------------------------------------

@dataclass(frozen=True)
class PartialSignature:
    """``sigma_i = M(message)^x_i`` from server ``index``."""

    index: int
    sigma: Element


def encode_partial_signature(partial: PartialSignature) -> bytes:
    """Tag 21: the server's index (``u8``) and ``sigma_i`` (G1)."""
    return Writer(TAG_PARTIAL_SIGNATURE).u8(partial.index).element(partial.sigma).done()


def decode_partial_signature(group: PairingGroup, data: bytes) -> PartialSignature:
    r = Reader(group, data, TAG_PARTIAL_SIGNATURE, "partial signature")
    partial = PartialSignature(r.u8(), r.element(G1))
    r.end()
    return partial


def _message_point(group: PairingGroup, message: bytes) -> Element:
    return group.hash_to_g1(message, DST_SIGNATURE)


def partial_sign(group: PairingGroup, secrets: ServerSecrets, message: bytes
                 ) -> PartialSignature:
    """``sigma_i = M(message)^x_i``."""
    return PartialSignature(secrets.index,
                            group.exp_secret(_message_point(group, message), secrets.x))


def verify_partial_signature(group: PairingGroup, tpk: ThresholdPublicKey, message: bytes,
                             partial: PartialSignature) -> bool:
    """``e(sigma_i, ĝ) = e(M(message), ĝ^x_i)``."""
    x_i = tpk.x_shares.get(partial.index)
    return x_i is not None and _holds(group, (partial.sigma, tpk.mpk.g_hat),
                                      (~_message_point(group, message), x_i))


def verify_partial_signatures(group: PairingGroup, tpk: ThresholdPublicKey,
                              messages: Sequence[bytes], partials: Sequence[PartialSignature]
                              ) -> bool:
    """One server's partial signatures of several messages, checked at once with 64-bit
    weights ``w_k`` (a wrong one passes with probability at most 2^-63):
    ``e(prod sigma_k^w_k, ĝ) = e(prod M(m_k)^w_k, ĝ^x_i)``."""
    if len(messages) != len(partials) or len({p.index for p in partials}) > 1:
        return False
    if not partials:
        return True
    x_i = tpk.x_shares.get(partials[0].index)
    if x_i is None:
        return False
    w = [system_random.randbits(BATCH_WEIGHT_BITS) | 1 for _ in partials]
    return _holds(group, (group.multi_exp([p.sigma for p in partials], w), tpk.mpk.g_hat),
                  (~group.multi_exp([_message_point(group, m) for m in messages], w), x_i))


def combine_signatures(group: PairingGroup, tpk: ThresholdPublicKey,
                       partials: Sequence[PartialSignature]) -> Element:
    """``sigma = prod sigma_i^lambda_i = M(message)^x`` over ``t`` servers: the same
    signature whichever ``t`` signed."""
    weights = _weights(tpk, [p.index for p in partials], group.order)
    return _combine(group, [p.sigma for p in partials], [weights[p.index] for p in partials])


def verify_signature(group: PairingGroup, X: Element, message: bytes, signature: Element
                     ) -> bool:
    """``e(sigma, ĝ) = e(M(message), X)``: one public key for the whole deployment."""
    return _holds(group, (signature, group.generator(G2)),
                  (~_message_point(group, message), X))


def link_quorum(t: int, n: int) -> int:
    """``q = ceil((n + t) / 2)``: any two sets of ``q`` of the ``n`` servers share at least
    ``2q - n >= t`` servers, so at least one honest server when at most ``t - 1`` are not.
    What needs one honest server in common (an address certified to one identity only)
    takes ``q`` servers' own consent, not ``t`` shares."""
    return (n + t + 1) // 2


MEMBERS_TAG = b"ibe-pubsub/v3/member-keys"
SCOPE_TAG = b"ibe-pubsub/v3/deployment-scope"


def deployment_scope(tpk: ThresholdPublicKey) -> bytes:
    """What every message a member signs with its own key starts with: the deployment's id
    and ``X``, so that such a signature counts in no other deployment (a member key may
    outlive a set-up: it is kept when a set-up is run again)."""
    return (Writer(TAG_MEMBER_KEYS).blob(SCOPE_TAG).blob(tpk.deployment)
            .element(tpk.X).done())


def members_message(tpk: ThresholdPublicKey, member_keys: Mapping[int, bytes]) -> bytes:
    """What ``t`` servers sign with their shares of ``x`` so that clients take the members'
    own Ed25519 keys (``threshold.json``) under the deployment's key ``X``: tag,
    deployment, the SHA-256 of the threshold public key (tag 18) the list goes with, then
    each index (``u8``) and 32-byte key, by index. ``X`` outlives a resharing; the public
    key does not, so a list signed before one (a removed member's key in it) does not
    verify for clients of the new set."""
    w = (Writer(TAG_MEMBER_KEYS).blob(MEMBERS_TAG).blob(tpk.deployment)
         .blob(hashlib.sha256(encode_public_key(tpk)).digest()).u8(len(member_keys)))
    for index in sorted(member_keys):
        w.u8(index).blob(member_keys[index])
    return w.done()


def encode_quorum_signature(signatures: Mapping[int, bytes]) -> bytes:
    """Tag 24: the signers' indices, ascending, each with its Ed25519 signature made with
    its own member key. Not a product of partial signatures: those of any ``t`` servers
    determine every other server's (their shares lie on one polynomial), so they cannot
    show that more than ``t`` consented; independent keys can."""
    w = Writer(TAG_QUORUM_SIGNATURE).u8(len(signatures))
    for index in sorted(signatures):
        w.u8(index).fixed(signatures[index])
    return w.done()


def verify_quorum_signature(member_keys: Mapping[int, bytes], quorum: int, message: bytes,
                            data: bytes) -> bool:
    """At least ``quorum`` distinct members signed ``message``, each with its own key
    (indices strictly ascending, so none counts twice)."""
    try:
        r = Reader(None, data, TAG_QUORUM_SIGNATURE, "quorum signature")
        signed = [(r.u8(), r.take(SIGNATURE_BYTES)) for _ in range(r.u8())]
        r.end()
    except CodecError:
        return False
    indices = [index for index, _ in signed]
    if (len(indices) < quorum or indices != sorted(set(indices))
            or any(i not in member_keys for i in indices)):
        return False
    return all(Ed25519Server(member_keys[i]).verify(message, signature)
               for i, signature in signed)


@dataclass(frozen=True)
class QuorumSigners:
    """A threshold deployment as the :class:`~credentials.server_keys.ServerVerifier` of
    what ``quorum`` of its members must each sign with their own key (tag 24): peer-link
    certificates. ``member_keys`` are the members' Ed25519 keys, index to raw 32 bytes;
    each signed ``scope`` (:func:`deployment_scope`) followed by the message."""

    member_keys: Mapping[int, bytes]
    quorum: int
    scope: bytes

    def verify(self, message: bytes, signature: bytes) -> bool:
        return verify_quorum_signature(self.member_keys, self.quorum, self.scope + message,
                                       signature)


def partial_sign_request(pp: PublicParams, secrets: ServerSecrets, identity: str,
                         credential: Credential, epoch: int, expires_at: int, seed: bytes,
                         binding: Element) -> tuple[bytes, PartialSignature]:
    """Member ``i``'s share of the signature of the connection request that
    :func:`~credentials.scheme.derive_connection_request` builds from ``identity``'s seed:
    the request's body and ``M(body)^x_i``. The member builds the request itself, for a
    credential the identity may hold, so a requester cannot have anything else signed;
    ``binding`` (the requester's ``V``) is signed with it. The body goes to the requester,
    which takes it once ``t`` members signed the same bytes instead of building it too."""
    request, _ = derive_connection_request(pp, identity, credential, epoch, expires_at, seed,
                                           binding)
    body = encode_request_body(request)
    return body, partial_sign(pp.group, secrets, body)


def signed_request(group: PairingGroup, tpk: ThresholdPublicKey, request: ConnectionRequest,
                   partials: Sequence[PartialSignature]) -> ConnectionRequest:
    """The request with ``t`` partial signatures of its body combined into ``M(body)^x``
    (its ``signature``: the G1 point's 48 bytes), which peers check against ``X``."""
    return replace(request, signature=bytes(combine_signatures(group, tpk, partials)))


@dataclass(frozen=True)
class ThresholdServer:
    """A threshold deployment as a :class:`~credentials.server_keys.ServerVerifier`: its
    signatures are ``M(message)^x`` (G1, 48 bytes compressed), checked against ``X``."""

    group: PairingGroup
    X: Element

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            sigma = self.group.deserialize(G1, signature)
        except GroupError:
            return False
        return verify_signature(self.group, self.X, message, sigma)
