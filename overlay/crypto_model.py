"""A cost-modelled crypto suite: plaintext credentials, real decisions, modelled time.

Requests, tokens and events carry their credentials and values in the clear
(msgpack) with an HMAC under a simulation secret standing in for the key
server's and publishers' signatures, so forged or altered objects are still
rejected. Every decision (open, route, decrypt) is the one the scheme (docs/scheme.md) would
take, decided by credential containment; each operation charges its cost from
a :class:`CostTable` (defaults below, or the JSON of ``ibe-pubsub bench crypto``).
With :meth:`CostTable.zero` this is the plaintext mode: no security costs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from ibe_pubsub.credentials import (
    Credential,
    Event,
    RequestOpening,
    Schema,
    SchemaError,
    enclosing_path,
)
from ibe_pubsub.overlay.config import OverlayConfigError
from ibe_pubsub.overlay.crypto import CostMeter, CryptoRejected, RootKit

#: Size of every MAC and tag of the model.
MAC_BYTES = 16

#: Seconds per operation: scheme version 2 on the mcl backend from Python, one core, as
#: ``bench crypto`` measured it for 3 attributes of 16 bits (route = decode of the
#: router's attribute + route test; open_request = one pairing; decrypt = d route
#: pairings + one multi-pairing). ``bench overlay`` replaces them with costs measured
#: on real cryptography in the same run.
DEFAULT_COSTS: dict[str, float] = {
    "decode_request": 0.0001, "check_request": 0.00015, "open_request": 0.0005,
    "acceptance_proof": 0.00001, "check_acceptance": 0.00003, "root_proof": 0.00005,
    "check_root_proof": 0.00025, "decode_token": 0.0003, "decode_event": 0.00015,
    "route": 0.0005, "verify": 0.0015, "decrypt": 0.003, "encrypt": 0.0136,
}


@dataclass(frozen=True)
class CostTable:
    """Seconds per crypto operation, charged by :class:`ModeledCrypto`."""

    seconds: Mapping[str, float]

    @classmethod
    def default(cls) -> CostTable:
        return cls(dict(DEFAULT_COSTS))

    @classmethod
    def zero(cls) -> CostTable:
        """Plaintext mode: no security, no processing cost."""
        return cls(dict.fromkeys(DEFAULT_COSTS, 0.0))

    @classmethod
    def from_json(cls, path: str | Path) -> CostTable:
        """A JSON object of operation name -> seconds (top level or under ``costs_s``);
        operations it does not name keep their defaults."""
        data = json.loads(Path(path).read_text())
        data = data.get("costs_s", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise OverlayConfigError(f"{path}: expected a JSON object of operation -> seconds")
        table = dict(DEFAULT_COSTS)
        for op, v in data.items():
            if op in table and isinstance(v, int | float) and v >= 0:
                table[op] = float(v)
        return cls(table)

    def __getitem__(self, op: str) -> float:
        return self.seconds.get(op, 0.0)


@dataclass(frozen=True)
class ModelRequest:
    attribute: str
    credential: Credential
    epoch: int
    expires_at: int
    nonce: bytes
    mac: bytes


@dataclass(frozen=True)
class ModelToken:
    """Like a blinded token: attribute and position, and a keyed tag in place of the
    credential, which only the route test (tag of the event's credential there) matches."""

    attribute: str
    position: int
    epoch: int
    tag: bytes


@dataclass(frozen=True)
class ModelEvent:
    event_id: str
    epoch: int
    values: dict[str, Any]
    body: bytes
    mac: bytes
    paths: dict[str, tuple[Credential, ...]]


@dataclass(frozen=True)
class ModelDecryptKey:
    epoch: int
    credentials: tuple[Credential, ...]


class ModeledCrypto:
    """Plaintext containment decisions, HMAC-authenticated objects, modelled costs."""

    def __init__(self, schema: Schema, secret: bytes, costs: CostTable | None = None) -> None:
        self.schema = schema
        self.secret = secret
        self.costs = costs or CostTable.default()
        self.meter = CostMeter()
        self._events: dict[bytes, ModelEvent] = {}

    # -- the modelled key server and publisher ------------------------------------------------

    @staticmethod
    def _blob(value: object, size: int | None = MAC_BYTES) -> bytes:
        """A byte field of a decoded message: bytes (of ``size`` unless None), else
        ``ValueError`` (``bytes()`` of a huge integer would allocate that many bytes)."""
        if not isinstance(value, bytes) or (size is not None and len(value) != size):
            raise CryptoRejected("a byte field is not bytes of the expected size")
        return value

    def _mac(self, *parts: object) -> bytes:
        data = msgpack.packb(list(parts), use_bin_type=True)
        return hmac.new(self.secret, data, hashlib.sha256).digest()[:MAC_BYTES]

    def sw(self, nonce: bytes, position: int) -> bytes:
        return self._mac("sw", nonce, position)

    def make_request(self, credential: Credential, epoch: int, expires_at: int,
                     nonce: bytes) -> tuple[bytes, tuple[bytes, ...]]:
        label = credential.label()
        mac = self._mac("req", credential.attribute, label, epoch, expires_at, nonce)
        data = msgpack.packb([credential.attribute, label, epoch, expires_at, nonce, mac],
                             use_bin_type=True)
        return data, tuple(self.sw(nonce, j) for j in range(credential.position + 1))

    def _tag(self, credential: Credential, epoch: int) -> bytes:
        return self._mac("tag", credential.label(), epoch)

    def make_token(self, credential: Credential, epoch: int) -> bytes:
        fields = [credential.attribute, credential.position, epoch, self._tag(credential, epoch)]
        return msgpack.packb([*fields, self._mac("tok", *fields)], use_bin_type=True)

    def make_root_certificate(self, attribute: str, epoch: int, expires_at: int) -> bytes:
        return msgpack.packb([attribute, epoch, expires_at,
                              self._mac("root", attribute, epoch, expires_at)],
                             use_bin_type=True)

    def encrypt(self, key: int, event: Event) -> bytes:
        """Seal an event as a modelled publisher would (charges ``encrypt``); its key is
        just the epoch."""
        epoch = key
        self.meter.charge("encrypt", self.costs["encrypt"])
        values = self.schema.validate_values(event.values)
        mac = self._mac("ev", event.event_id, epoch, values, event.body)
        return msgpack.packb([event.event_id, epoch, values, event.body, mac], use_bin_type=True)

    # -- the CryptoSuite protocol -------------------------------------------------------------

    def _charge(self, op: str) -> None:
        self.meter.charge(op, self.costs[op])

    def decode_request(self, data: bytes) -> ModelRequest:
        self._charge("decode_request")
        try:
            a, label, epoch, expires, nonce, mac = msgpack.unpackb(data, raw=False)
            cred = Credential.from_label(label)
            return ModelRequest(a, cred, int(epoch), int(expires), self._blob(nonce, None),
                                self._blob(mac))
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
            raise CryptoRejected(f"malformed connection request: {exc}") from None

    def request_attribute(self, request: ModelRequest) -> str:
        return request.attribute

    def request_epoch(self, request: ModelRequest) -> int:
        return request.epoch

    def request_nonce(self, request: ModelRequest) -> bytes:
        return request.nonce

    def check_request(self, request: ModelRequest, now: float, epochs: Collection[int]) -> None:
        self._charge("check_request")
        r = request
        if not hmac.compare_digest(r.mac, self._mac("req", r.attribute, r.credential.label(),
                                                    r.epoch, r.expires_at, r.nonce)):
            raise CryptoRejected("connection request signature does not verify")
        if r.attribute not in self.schema.names or r.credential.attribute != r.attribute:
            raise CryptoRejected("connection request for an unknown attribute")
        if r.epoch not in epochs:
            raise CryptoRejected(f"connection request of epoch {r.epoch} is not accepted")
        if r.expires_at < now:
            raise CryptoRejected("connection request expired")

    def open_request(self, opener: tuple[Credential, int], request: ModelRequest
                     ) -> RequestOpening | None:
        self._charge("open_request")
        mine, epoch = opener
        if epoch != request.epoch or not mine.covers(request.credential):
            return None
        return RequestOpening(self.sw(request.nonce, mine.position),
                              request.credential.position)

    def acceptance_proof(self, sw: bytes, request: ModelRequest, context: bytes) -> bytes:
        self._charge("acceptance_proof")
        return hmac.new(sw, b"accept" + request.nonce + context, hashlib.sha256).digest()

    def check_acceptance(self, sws: Sequence[bytes], request: ModelRequest, proof: bytes,
                         context: bytes) -> bool:
        self._charge("check_acceptance")
        return any(hmac.compare_digest(hmac.new(sw, b"accept" + request.nonce + context,
                                                hashlib.sha256).digest(), proof) for sw in sws)

    def root_proof(self, root: RootKit, request: ModelRequest, context: bytes) -> bytes:
        self._charge("root_proof")
        return self._mac("root-accept", root.certificate, request.nonce, context)

    def check_root_proof(self, certificate: bytes, attribute: str, request: ModelRequest,
                         proof: bytes, context: bytes, now: float) -> bool:
        self._charge("check_root_proof")
        try:
            a, epoch, expires, mac = msgpack.unpackb(certificate, raw=False)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError):
            return False
        return (a == attribute and isinstance(expires, int) and expires >= now
                and hmac.compare_digest(bytes(mac), self._mac("root", a, epoch, expires))
                and hmac.compare_digest(proof, self._mac("root-accept", certificate,
                                                         request.nonce, context)))

    def decode_token(self, data: bytes) -> ModelToken:
        self._charge("decode_token")
        try:
            attribute, position, epoch, tag, mac = msgpack.unpackb(data, raw=False)
            if not hmac.compare_digest(self._blob(mac), self._mac("tok", attribute, position,
                                                                   epoch, tag)):
                raise CryptoRejected("token is not authentic")
            return ModelToken(str(attribute), int(position), int(epoch), self._blob(tag))
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
            raise CryptoRejected(f"malformed routing token: {exc}") from None

    def token_epoch(self, token: ModelToken) -> int:
        return token.epoch

    def decode_event(self, data: bytes) -> ModelEvent:
        self._charge("decode_event")
        cached = self._events.get(data)
        if cached is not None:
            return cached
        try:
            event_id, epoch, values, body, mac = msgpack.unpackb(data, raw=False)
            values = self.schema.validate_values(values)
            paths = {a: enclosing_path(self.schema, a, v) for a, v in values.items()}
            if not isinstance(body, bytes):
                raise TypeError("the event body is not bytes")
            event = ModelEvent(str(event_id), int(epoch), values, body, self._blob(mac), paths)
        except (ValueError, TypeError, SchemaError, msgpack.ExtraData,
                msgpack.FormatError) as exc:
            raise CryptoRejected(f"malformed event: {exc}") from None
        if len(self._events) > 4096:
            self._events.clear()
        self._events[data] = event
        return event

    def event_epoch(self, event: ModelEvent) -> int:
        return event.epoch

    def event_is_stream(self, event: ModelEvent) -> bool:
        return False  # the model has no streams

    def route(self, token: ModelToken, event: ModelEvent) -> bool:
        self._charge("route")
        path = event.paths.get(token.attribute, ())
        return (token.epoch == event.epoch and token.position < len(path)
                and hmac.compare_digest(self._tag(path[token.position], event.epoch), token.tag))

    def digest_entry(self, event: ModelEvent, attribute: str, position: int) -> bytes:
        """(epoch, position, tag of the event's credential there, the event's MAC): the
        tag stands for R_ij, the MAC for C1_i, which makes each event's entry its own."""
        path = event.paths.get(attribute, ())
        tag = self._tag(path[position], event.epoch) if position < len(path) else b""
        return msgpack.packb([event.epoch, position, tag, event.mac], use_bin_type=True)

    def route_entry(self, token: ModelToken, entry: bytes) -> bool:
        self._charge("route")
        try:
            epoch, position, tag, c1 = msgpack.unpackb(entry, raw=False)
            tag = self._blob(tag) if tag else b""  # empty: the event has no tag there
            self._blob(c1)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
            raise CryptoRejected(f"malformed digest entry: {exc}") from None
        return (token.epoch == epoch and token.position == position
                and hmac.compare_digest(tag, token.tag))

    def verify(self, event: ModelEvent) -> bool:
        self._charge("verify")
        return hmac.compare_digest(event.mac, self._mac(
            "ev", event.event_id, event.epoch, event.values, event.body))

    def decrypt(self, key: ModelDecryptKey, event: ModelEvent) -> Event | None:
        self._charge("decrypt")
        if key.epoch != event.epoch:
            return None
        for attribute, path in event.paths.items():
            leaf = path[-1]
            if not any(c.covers(leaf) for c in key.credentials if c.attribute == attribute):
                return None
        return Event(event.event_id, dict(event.values), event.body)

    def open_epoch(self, epoch: int, ends_at: float | None = None) -> None:
        """Nothing to open: the model keeps no per-epoch cache."""

    def drop_epoch(self, epoch: int) -> None:
        """Nothing to forget: the model keeps no per-epoch cache."""

    def for_peer(self) -> ModeledCrypto:
        """The model's only cache (decoded events) holds no secret: peers share it."""
        return self
