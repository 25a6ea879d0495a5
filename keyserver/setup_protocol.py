"""The threshold key service's set-up without a dealer (docs/scheme.md, section 16.1), run
among the key servers themselves, as a sans-I/O machine.

Each server runs one :class:`SetupMember`. It publishes signed messages, one per round, and
takes the other members' (:meth:`SetupMember.receive`); the transport
(:mod:`ibe_pubsub.keyserver.setup_http`) only carries bytes and asks :meth:`missing` what to
fetch. Every message is signed with the member's Ed25519 key, which every operator pinned
in the :class:`SetupPlan`, so no relay or network attacker can speak for a member. The
shares of the key generations are encrypted to their recipient (X25519 from the signed
``hello``, HKDF, ChaCha20-Poly1305), so the transport needs neither confidentiality nor
authenticity of its own.

The rounds, each started once every member's message of the one before arrived:

``hello``
    a fresh X25519 key for this set-up.
``deal``
    per secret (``delta``, ``phi``, ``x``, and ``rho``, a sharing of zero that binds key
    shares to their identity): the Feldman commitments (``rho``'s without ``C_0``, the
    identity), and every member's share encrypted to it.
``complain``
    the complaints, and a digest of every ``deal`` this member took. Every member checks
    that all digests agree: a member that sent different deals to different members
    stops the set-up here (the broadcast must be consistent).
``answer``
    the shares this member reveals to answer complaints against it, and a digest of every
    ``complain``.
``beta``
    member ``k``'s step of the ``beta`` ceremony, once it has checked steps ``1..k-1``.
``confirm``
    a digest of the assembled public key: every member must reach the same one.
``done``
    this member has its result, so the others may stop serving it.

A dealer whose dealing is malformed or whose answers fail is disqualified, as Pedersen's
protocol has it, and the set-up goes on with the others. Everything else a member can do
wrong (an invalid ``beta`` step, different messages to different members, a message that
does not parse) stops the set-up with :class:`SetupError` naming that member: it must then
be run again without it. Every member must take part in every round.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ibe_pubsub.credentials import (
    ED25519_KEY_BYTES,
    G1,
    G2,
    BetaState,
    BetaStep,
    Complaint,
    CredentialsError,
    Dealing,
    DkgError,
    DkgResult,
    Justification,
    PairingGroup,
    Participant,
    beta_step,
    check_beta_step,
    initial_beta_state,
)
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver.epochs import DEFAULT_EPOCH_SECONDS, check_lengths, default_grace
from ibe_pubsub.keyserver.exceptions import KeyServerError, ServerSettingsError

SECRETS = ("delta", "phi", "x", "rho")
#: The sharing of zero: its dealings' ``C_0`` is the identity, left off the wire.
ZERO_SECRETS = frozenset({"rho"})
ROUNDS = ("hello", "deal", "complain", "answer", "beta", "confirm", "done")
#: Signed before the session exists: ``hello`` makes it. Every other round, ``beta`` too, is
#: signed under the session, so no step of an earlier run of the plan can be replayed.
SESSION_FREE = frozenset({"hello"})
#: No honest message comes near this; the transport refuses longer ones unread.
MAX_MESSAGE_BYTES = 1 << 20
SIGNATURE_LABEL = b"IBE-PUBSUB-V3-SETUP"
SHARE_LABEL = b"IBE-PUBSUB-V3-SETUP-SHARE"


class SetupError(KeyServerError):
    """The set-up cannot finish; the message names the member at fault where one is."""


class RefusedMessage(KeyServerError):
    """Bytes that are no member's message for this set-up: ignored, not fatal, since
    anyone on the path can send them."""


@dataclass(frozen=True)
class Member:
    """A key server of the deployment: where it publishes its messages, and its pinned
    Ed25519 public key (raw, 32 bytes)."""

    url: str
    key: bytes


@dataclass(frozen=True)
class SetupPlan:
    """What every operator agrees on before the set-up: the deployment's label, the
    threshold, the members in order (member ``i`` is server ``i``, from 1), and the epoch
    length and grace window every member numbers its epochs by (``None``: the default
    grace for that length, as ``keyserver init`` takes it)."""

    deployment: str
    t: int
    members: tuple[Member, ...]
    epoch_seconds: int = DEFAULT_EPOCH_SECONDS
    grace_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.grace_seconds is None:
            object.__setattr__(self, "grace_seconds", default_grace(self.epoch_seconds))
        try:
            check_lengths(self.epoch_seconds, self.grace)
        except ServerSettingsError as exc:
            raise SetupError(str(exc)) from exc
        n = len(self.members)
        if not self.deployment:
            raise SetupError("the deployment needs a label")
        if self.t < 2:
            raise SetupError("a threshold below 2 would let one server derive every key; "
                             "use the single key server instead")
        if n < 2 * self.t - 1:
            raise SetupError(f"a threshold of {self.t} needs at least {2 * self.t - 1} "
                             f"members (n >= 2t - 1), got {n}")
        if len({m.key for m in self.members}) != n or len({m.url for m in self.members}) != n:
            raise SetupError("every member needs its own key and its own address")
        if any(len(m.key) != ED25519_KEY_BYTES for m in self.members):
            raise SetupError("a member key must be a raw 32-byte Ed25519 public key")

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def grace(self) -> int:
        assert self.grace_seconds is not None  # set in __post_init__
        return self.grace_seconds

    def digest(self) -> bytes:
        """SHA-256 of the plan: every message carries it, so members with different plans
        never mix their messages."""
        return hashlib.sha256(msgpack.packb(
            ["ibe-pubsub-setup-plan-v2", self.deployment, self.t,
             [[m.url, m.key] for m in self.members], self.epoch_seconds, self.grace])).digest()

    def index_of(self, key: bytes) -> int:
        """The member number of the holder of ``key``."""
        for index, member in enumerate(self.members, start=1):
            if member.key == key:
                return index
        raise SetupError("this server's member key is not one of the plan's members")


@dataclass(frozen=True)
class SetupResult:
    """One member's outcome: its own secrets, which never leave it, and what every member
    agrees on."""

    secrets: T.ServerSecrets
    public_key: T.ThresholdPublicKey
    qualified: Mapping[str, frozenset[int]]


def raw_public_key(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _signed_part(plan_digest: bytes, session: bytes, sender: int, round_name: str,
                 body: bytes) -> bytes:
    """What a member signs: the plan, the session (empty for ``hello`` and ``beta``), the
    author, the round and the body. Transcripts and duplicate checks use these bytes too,
    so re-encoding a message on the way changes nothing."""
    return b"".join((SIGNATURE_LABEL, plan_digest, len(session).to_bytes(1, "big"), session,
                     sender.to_bytes(4, "big"), round_name.encode(), b"\0", body))


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _transcript(signed: Mapping[int, bytes]) -> bytes:
    """A digest of one round's signed messages, in member order."""
    digest = hashlib.sha256()
    for sender in sorted(signed):
        digest.update(hashlib.sha256(signed[sender]).digest())
    return digest.digest()


class SetupMember:
    """One server's side of the set-up. Feed it every member's messages with
    :meth:`receive` (its own included, as :meth:`published` gives them); it publishes its
    next message as soon as it can, and :attr:`result` is set once all agree."""

    def __init__(self, group: PairingGroup, plan: SetupPlan, signing_key: Ed25519PrivateKey,
                 random_bytes: Any = os.urandom) -> None:
        self.group, self.plan, self._signing_key = group, plan, signing_key
        self.index = plan.index_of(raw_public_key(signing_key))
        self._plan_digest = plan.digest()
        self._deployment = plan.deployment.encode()
        self._g2 = T.derive_g2(group, self._deployment)
        self._exchange_key = X25519PrivateKey.generate()
        self._prf_key = random_bytes(32)
        self._dkg = {name: Participant(group, self.index, plan.t, plan.n, name in ZERO_SECRETS)
                     for name in SECRETS}
        self._exchange_keys: dict[int, X25519PublicKey] = {}
        self._session: bytes | None = None
        self._complained: set[tuple[str, int, int]] = set()
        # Per round, each member's signed bytes (_signed_part) and its body.
        self._received: dict[str, dict[int, bytes]] = {r: {} for r in ROUNDS}
        self._bodies: dict[str, dict[int, bytes]] = {r: {} for r in ROUNDS}
        self._published: dict[str, bytes] = {}
        self._answers: dict[str, list[Justification]] = {name: [] for name in SECRETS}
        self._answers_taken = False
        self._beta: list[BetaState] = [initial_beta_state(self._g2, group.generator(G2))]
        self._confirmed: bytes | None = None
        self._outcome: tuple[dict[str, DkgResult], T.ThresholdPublicKey] | None = None
        self.result: SetupResult | None = None
        self._publish("hello", self._exchange_key.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw))

    # -- what the transport asks ----------------------------------------------------------

    def published(self, round_name: str) -> bytes | None:
        """This member's signed message of ``round_name``, once it exists."""
        return self._published.get(round_name)

    def missing(self) -> list[tuple[int, str]]:
        """The members' messages this member waits for: of every round it has reached,
        and every ``beta`` step (they come one after another)."""
        return [(sender, r) for r in ROUNDS
                if r in self._published or (r == "beta" and self._session is not None)
                for sender in range(1, self.plan.n + 1) if sender not in self._received[r]]

    def finished_with_everyone(self) -> bool:
        """Every member has its result: no one needs this member's messages any more."""
        return len(self._received["done"]) == self.plan.n

    def round_reached(self) -> str:
        """The last round this member published, for progress reports."""
        return [r for r in ROUNDS if r in self._published][-1]

    # -- messages -------------------------------------------------------------------------

    def _session_of(self, round_name: str) -> bytes:
        if round_name in SESSION_FREE:
            return b""
        assert self._session is not None
        return self._session

    def _envelope(self, round_name: str, body: bytes) -> bytes:
        """``body`` as this member's signed message of ``round_name``."""
        signature = self._signing_key.sign(_signed_part(
            self._plan_digest, self._session_of(round_name), self.index, round_name, body))
        return msgpack.packb([self._plan_digest, self.index, round_name, body, signature])

    def _publish(self, round_name: str, body: bytes) -> None:
        self._published[round_name] = self._envelope(round_name, body)
        self._received[round_name][self.index] = _signed_part(
            self._plan_digest, self._session_of(round_name), self.index, round_name, body)
        self._bodies[round_name][self.index] = body

    def receive(self, data: bytes) -> None:
        """Take one signed message. :class:`RefusedMessage` if it is not a member's message
        for this plan (a forgery, or noise); :class:`SetupError` if a member's message
        ends the set-up (a second, different message for one round; a different plan;
        content that breaks the protocol)."""
        if len(data) > MAX_MESSAGE_BYTES:
            raise RefusedMessage(f"a message of {len(data)} bytes, over the bound")
        try:
            plan_digest, sender, round_name, body, signature = _unpack(data)
            if not (isinstance(plan_digest, bytes) and isinstance(body, bytes)
                    and isinstance(signature, bytes) and type(sender) is int
                    and round_name in ROUNDS and 0 < sender <= self.plan.n):
                raise RefusedMessage("not a set-up message")
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise RefusedMessage(f"not a set-up message: {exc}") from exc
        if round_name not in SESSION_FREE and self._session is None:
            raise RefusedMessage(f"member {sender}'s {round_name} message came before this "
                                 "member had every hello")
        signed = _signed_part(plan_digest, self._session_of(round_name), sender, round_name,
                              body)
        try:
            Ed25519PublicKey.from_public_bytes(self.plan.members[sender - 1].key).verify(
                signature, signed)
        except InvalidSignature as exc:
            raise RefusedMessage(
                f"a {round_name} message in member {sender}'s name that its key did not sign"
                + ("" if round_name in SESSION_FREE else " for this session (another run of "
                   "the plan, or members that took other hellos)")) from exc
        if plan_digest != self._plan_digest:
            raise SetupError(f"member {sender} runs a different plan (deployment, threshold "
                             f"or members): its plan digest is {plan_digest.hex()[:16]}, "
                             f"this member's {self._plan_digest.hex()[:16]}")
        known = self._received[round_name].get(sender)
        if known is not None:
            if known != signed:
                raise SetupError(f"two different {round_name} messages signed by member "
                                 f"{sender} (a member that runs twice, or a replay of an "
                                 "earlier run)")
            return
        self._received[round_name][sender] = signed
        self._bodies[round_name][sender] = body
        self._advance()

    # -- rounds ---------------------------------------------------------------------------

    def _have_all(self, round_name: str) -> bool:
        return len(self._received[round_name]) == self.plan.n

    def _advance(self) -> None:
        """Publish every message that can be published now, in round order."""
        while self._check_beta_steps() or self._next_message():
            pass

    def _next_message(self) -> bool:
        """Publish the next message if its round's inputs are all here."""
        if "deal" not in self._published and self._have_all("hello"):
            self._take_hellos()
            self._publish("deal", self._deal())
        elif "complain" not in self._published and self._have_all("deal"):
            self._take_deals()
            self._publish("complain", self._complain())
        elif "answer" not in self._published and self._have_all("complain"):
            self._publish("answer", self._answer())
        elif not self._answers_taken and "answer" in self._published and self._have_all(
                "answer"):
            self._take_answers()
        elif ("beta" not in self._published and "deal" in self._published
              and len(self._beta) == self.index):
            self._publish("beta", self._beta_step())
        elif self._confirmed is None and self._answers_taken and len(
                self._beta) == self.plan.n + 1:
            self._publish("confirm", self._confirm())
        elif self.result is None and self._confirmed is not None and self._have_all("confirm"):
            self._take_confirms()
            self._publish("done", b"")
        else:
            return False
        return True

    def _take_hellos(self) -> None:
        """The members' X25519 keys (each tried once), and the session: a digest of every
        hello, which every later message is signed under. Members that took different
        hellos (a replay of an earlier run, say) then refuse each other's messages, and no
        share is ever encrypted to, or revealed for, a key its member did not send."""
        for sender, body in sorted(self._bodies["hello"].items()):
            try:
                key = X25519PublicKey.from_public_bytes(body)
                self._exchange_key.exchange(key)
            except ValueError as exc:
                raise SetupError(f"member {sender}'s hello holds no usable X25519 key") from exc
            self._exchange_keys[sender] = key
        self._session = hashlib.sha256(self._plan_digest
                                       + _transcript(self._received["hello"])).digest()

    def _share_cipher(self, dealer: int, recipient: int, name: str) -> tuple[ChaCha20Poly1305,
                                                                               bytes]:
        """The key of the one share ``dealer`` sends ``recipient`` for ``name``, from their
        X25519 keys, and the data it authenticates."""
        peer = recipient if dealer == self.index else dealer
        assert self._session is not None
        context = b"".join((SHARE_LABEL, self._session, dealer.to_bytes(4, "big"),
                            recipient.to_bytes(4, "big"), name.encode()))
        secret = self._exchange_key.exchange(self._exchange_keys[peer])
        key = HKDF(hashes.SHA256(), 32, salt=self._plan_digest, info=context).derive(secret)
        return ChaCha20Poly1305(key), context

    def _deal(self) -> bytes:
        body = {}
        size = self.group.scalar_size
        for name, participant in self._dkg.items():
            dealing, shares = participant.dealing()
            sealed = {}
            for recipient, share in shares.items():
                cipher, context = self._share_cipher(self.index, recipient, name)
                sealed[recipient] = cipher.encrypt(bytes(12), share.to_bytes(size, "big"),
                                                   context)
            sent = dealing.commitments[1:] if participant.zero else dealing.commitments
            body[name] = [[bytes(c) for c in sent], sealed]
        return msgpack.packb(body)

    def _take_deals(self) -> None:
        """Each dealing that parses goes to its key generation, and this member's share if
        it opens; one that does not parse counts as no dealing (its dealer is then not
        qualified), and a share that does not open draws a complaint."""
        for dealer, data in sorted(self._bodies["deal"].items()):
            for name, participant in self._dkg.items():
                parsed = self._dealing(dealer, data, name)
                if parsed is None:
                    continue
                dealing, sealed = parsed
                participant.receive(dealer, dealing)
                share = self._open_share(dealer, name, sealed)
                if share is not None:
                    participant.receive_share(dealer, share)

    def _dealing(self, dealer: int, data: bytes, name: str) -> tuple[Dealing, Any] | None:
        """Dealer ``dealer``'s dealing of ``name`` and its sealed shares, if they are
        exactly ``t`` commitments (``t - 1`` for a sharing of zero, whose ``C_0`` is the
        identity), each a G2 element, and a map; None otherwise (no dealing)."""
        size = self.group.sizes[G2]
        zero = self._dkg[name].zero
        try:  # hostile bytes: whatever fails to parse is no dealing, never a crash
            commitments, sealed = _unpack(data)[name]
            if (not isinstance(sealed, dict) or not isinstance(commitments, list)
                    or len(commitments) != self.plan.t - zero
                    or not all(isinstance(c, bytes) and len(c) == size for c in commitments)):
                return None
            first = (self.group.identity(G2),) if zero else ()
            return Dealing(dealer, first + tuple(self.group.deserialize(G2, c)
                                                 for c in commitments)), sealed
        except Exception:  # any parse failure means "no dealing"
            return None

    def _open_share(self, dealer: int, name: str, sealed: Any) -> int | None:
        try:
            cipher, context = self._share_cipher(dealer, self.index, name)
            plain = cipher.decrypt(bytes(12), sealed[self.index], context)
        except (KeyError, TypeError, ValueError, InvalidTag):  # a complaint follows
            return None
        value = int.from_bytes(plain, "big")
        return value if len(plain) == self.group.scalar_size and value < self.group.order \
            else None

    def _complain(self) -> bytes:
        return msgpack.packb({
            "transcript": _transcript(self._received["deal"]),
            "complaints": {name: [c.dealer for c in p.complaints()]
                           for name, p in self._dkg.items()}})

    def _check_transcript(self, sender: int, body: Mapping[str, Any], round_name: str) -> None:
        if body.get("transcript") != _transcript(self._received[round_name]):
            raise SetupError(f"member {sender} saw other {round_name} messages than member "
                             f"{self.index}: a member sent different messages to different "
                             "members, so the set-up stops")

    def _member_body(self, round_name: str, sender: int) -> dict[str, Any]:
        try:
            body = _unpack(self._bodies[round_name][sender])
        except Exception as exc:  # hostile bytes
            raise SetupError(f"member {sender}'s {round_name} message does not parse") from exc
        if not isinstance(body, dict):
            raise SetupError(f"member {sender}'s {round_name} message does not parse")
        return body

    def _answer(self) -> bytes:
        """Take every complaint; answer those against this member."""
        for accuser in range(1, self.plan.n + 1):
            body = self._member_body("complain", accuser)
            self._check_transcript(accuser, body, "deal")
            try:
                for name, participant in self._dkg.items():
                    for dealer in body["complaints"][name]:
                        if type(dealer) is not int:
                            raise TypeError(f"complaint against {dealer!r}")
                        answer = participant.receive(accuser, Complaint(accuser, dealer))
                        self._complained.add((name, accuser, dealer))
                        if answer is not None:
                            self._answers[name].append(answer)
            except Exception as exc:  # hostile content ends the set-up
                raise SetupError(f"member {accuser}'s complaints break the protocol: "
                                 f"{exc}") from exc
        size = self.group.scalar_size
        return msgpack.packb({
            "transcript": _transcript(self._received["complain"]),
            "answers": {name: [[a.accuser, a.share.to_bytes(size, "big")] for a in answers]
                        for name, answers in self._answers.items()}})

    def _take_answers(self) -> None:
        for dealer in range(1, self.plan.n + 1):
            body = self._member_body("answer", dealer)
            self._check_transcript(dealer, body, "complain")
            try:
                for name, participant in self._dkg.items():
                    for accuser, share in body["answers"][name]:
                        if type(accuser) is not int or not isinstance(share, bytes) or len(
                                share) != self.group.scalar_size:
                            raise TypeError("an answer is not [member, share]")
                        if (name, accuser, dealer) in self._complained:  # others: ignored
                            participant.receive(dealer, Justification(
                                dealer, accuser, int.from_bytes(share, "big")))
            except Exception as exc:  # hostile content ends the set-up
                raise SetupError(f"member {dealer}'s answers break the protocol: "
                                 f"{exc}") from exc
        self._answers_taken = True

    def _beta_step(self) -> bytes:
        step = beta_step(self.group, self._deployment, self.index, self._beta[-1])
        return msgpack.packb([bytes(step.state.W), bytes(step.state.G), bytes(step.state.hd),
                              bytes(step.R), step.z.to_bytes(self.group.scalar_size, "big")])

    def _check_beta_steps(self) -> bool:
        """Check the next steps of the chain that arrived, in member order."""
        checked = False
        while (server := len(self._beta)) in self._bodies["beta"]:
            try:
                W, G, hd, R, z = _unpack(self._bodies["beta"][server])
                if not all(isinstance(b, bytes) for b in (W, G, hd, R, z)):
                    raise TypeError("a beta step is five byte strings")
                step = BetaStep(server, BetaState(self.group.deserialize(G1, W),
                                                  self.group.deserialize(G1, G),
                                                  self.group.deserialize(G2, hd)),
                                self.group.deserialize(G2, R), int.from_bytes(z, "big"))
                self._beta.append(check_beta_step(self.group, self._deployment, self._g2,
                                                  self._beta[-1], step, server))
            except Exception as exc:  # hostile content ends the set-up
                raise SetupError(f"member {server}'s beta step is refused: {exc} (if member "
                                 f"{server - 1} showed different steps to different members, "
                                 "the fault is its own)") from exc
            checked = True
        return checked

    def _confirm(self) -> bytes:
        """Finish the four key generations, assemble the public key, and publish its
        digest."""
        try:
            results = {name: p.finish() for name, p in self._dkg.items()}
        except DkgError as exc:
            raise SetupError(f"the key generation cannot finish: {exc}") from exc
        identity = self.group.identity(G2)
        for name, result in results.items():
            for member, public_share in sorted(result.public_shares.items()):
                if public_share == identity:  # only a dealer that saw the others' deals can
                    raise SetupError(f"member {member}'s share of {name} would be zero: it "
                                     "chose its polynomial to cancel the others'")
        delta, phi, x, rho = (results[name] for name in SECRETS)
        try:
            public_key = T.assemble_public_key(
                self.group, self._deployment, self.plan.t, self.plan.n, self._beta[-1],
                delta.public_key, delta.public_shares, phi.public_key, phi.public_shares,
                x.public_key, x.public_shares, rho.public_shares)
        except CredentialsError as exc:
            raise SetupError(f"the public key cannot be assembled: {exc}") from exc
        self._outcome = results, public_key
        self._confirmed = hashlib.sha256(T.encode_public_key(public_key)).digest()
        return self._confirmed

    def _take_confirms(self) -> None:
        for sender, digest in sorted(self._bodies["confirm"].items()):
            if digest != self._confirmed:
                raise SetupError(f"members {sender} and {self.index} assembled different public "
                                 "keys (some member showed different answers or beta steps to "
                                 "different members): the set-up stops")
        assert self._outcome is not None
        results, public_key = self._outcome
        delta, phi, x, rho = (results[name] for name in SECRETS)
        self.result = SetupResult(
            T.ServerSecrets(self.index, delta.share, phi.share, x.share, rho.share,
                            self._prf_key),
            public_key, {name: r.qualified for name, r in results.items()})


def public_key_fingerprint(public_key: T.ThresholdPublicKey) -> str:
    """What operators compare out of band: the first 16 bytes of SHA-256 of the encoded
    public key, in hex."""
    return hashlib.sha256(T.encode_public_key(public_key)).hexdigest()[:32]
