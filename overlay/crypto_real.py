"""The crypto suite of the scheme (docs/scheme.md), credentials.scheme, behind the protocol.

Every operation is timed into the :class:`~overlay.crypto.CostMeter`, so a
simulator running real cryptography charges the real processing delay.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ibe_pubsub.credentials import (
    AnyEvent,
    ConnectionRequest,
    Event,
    PublicParams,
    PublisherKey,
    RequestOpening,
    RootCertificate,
    Schema,
    ServerVerifier,
    StreamEvent,
    codec,
    scheme,
    streams,
)
from ibe_pubsub.overlay.crypto import CostMeter, CryptoRejected, RootKit


def _root_signed(request: ConnectionRequest, context: bytes) -> bytes:
    return b"root-accept" + hashlib.sha256(codec.encode_request(request)).digest() + context


class RealCrypto:
    """Pairing-based checks with the key service's public key as trust anchor (``server``:
    a key server's Ed25519 key, or a threshold deployment's ``X``).
    Events of both kinds, version 2 and streams, are taken; a stream's are checked against
    ``clock`` (certificate expiry) and use this peer's per-epoch stream caches."""

    def __init__(self, pp: PublicParams, server: ServerVerifier,
                 clock: Callable[[], float] = time.time) -> None:
        self.pp = pp
        self.server = server
        self.meter = CostMeter()
        self.clock = clock
        self.streams = streams.StreamCaches()

    @property
    def schema(self) -> Schema:
        return self.pp.schema

    def decode_request(self, data: bytes) -> ConnectionRequest:
        with self.meter.timed("decode_request"):
            try:
                return codec.decode_request(self.pp.group, data)
            except codec.CodecError as exc:
                raise CryptoRejected(str(exc)) from None

    def request_attribute(self, request: ConnectionRequest) -> str:
        return request.attribute

    def request_epoch(self, request: ConnectionRequest) -> int:
        return request.epoch

    def request_nonce(self, request: ConnectionRequest) -> bytes:
        return request.nonce

    def check_request(self, request: ConnectionRequest, now: float,
                      epochs: Collection[int]) -> None:
        with self.meter.timed("check_request"):
            try:
                scheme.check_connection_request(self.pp, request, self.server, now, epochs)
            except scheme.RequestRejected as exc:
                raise CryptoRejected(str(exc)) from None

    def open_request(self, opener: Any, request: ConnectionRequest) -> RequestOpening | None:
        with self.meter.timed("open_request"):
            return scheme.open_connection_request(self.pp, opener, request)

    def acceptance_proof(self, sw: bytes, request: ConnectionRequest, context: bytes) -> bytes:
        with self.meter.timed("acceptance_proof"):
            return scheme.acceptance_proof(sw, request, context)

    def check_acceptance(self, sws: Sequence[bytes], request: ConnectionRequest, proof: bytes,
                         context: bytes) -> bool:
        with self.meter.timed("check_acceptance"):
            return scheme.check_acceptance(sws, request, proof, context) is not None

    def root_proof(self, root: RootKit, request: ConnectionRequest, context: bytes) -> bytes:
        with self.meter.timed("root_proof"):
            return bytes(root.signer.sign(_root_signed(request, context)))

    def check_root_proof(self, certificate: bytes, attribute: str, request: ConnectionRequest,
                         proof: bytes, context: bytes, now: float) -> bool:
        with self.meter.timed("check_root_proof"):
            try:
                cert = RootCertificate.from_bytes(certificate)
                if not cert.verify(self.server, attribute, now):
                    return False
                Ed25519PublicKey.from_public_bytes(cert.transport_key).verify(
                    proof, _root_signed(request, context))
            except (ValueError, InvalidSignature):
                return False
            return True

    def decode_token(self, data: bytes) -> Any:
        with self.meter.timed("decode_token"):
            try:
                return codec.decode_blinded_token(self.pp.group, data)
            except codec.CodecError as exc:
                raise CryptoRejected(str(exc)) from None

    def token_epoch(self, token: Any) -> int:
        return int(token.epoch)

    def decode_event(self, data: bytes) -> AnyEvent:
        """The event, if it decodes and has this schema's shape (every attribute, each with
        its number of positions): what every later step indexes by."""
        with self.meter.timed("decode_event"):
            try:
                event = codec.decode_any_event(self.pp.group, data)
                scheme.check_structure(self.pp, event)
            except (codec.CodecError, scheme.SchemeError) as exc:
                raise CryptoRejected(str(exc)) from None
            return event

    def event_epoch(self, event: AnyEvent) -> int:
        return event.header.epoch

    def event_is_stream(self, event: AnyEvent) -> bool:
        return isinstance(event, StreamEvent)

    def route(self, token: Any, event: AnyEvent) -> bool:
        """A stream's route tests are cached by (token, C1_i) in the epochs this peer holds
        keys of (:meth:`open_epoch`): reused entries cost none."""
        with self.meter.timed("route"):
            if not isinstance(event, StreamEvent):
                return scheme.route_test(self.pp, token, event)
            if self.streams.closed(event.header.epoch):
                return False
            caches = self.streams.epoch(event.header.epoch)
            return scheme.route_test(self.pp, token, event,
                                     None if caches is None else caches.position_keys)

    def digest_entry(self, event: AnyEvent, attribute: str, position: int) -> bytes:
        return codec.encode_route_entry(scheme.route_entry(self.pp, event, attribute, position))

    def route_entry(self, token: Any, entry: bytes) -> bool:
        with self.meter.timed("route"):
            try:
                decoded = codec.decode_route_entry(self.pp.group, entry)
            except codec.CodecError as exc:
                raise CryptoRejected(str(exc)) from None
            return scheme.route_test_entry(self.pp, token, decoded)

    def verify(self, event: AnyEvent) -> bool:
        with self.meter.timed("verify"):
            if isinstance(event, StreamEvent):
                return streams.stream_verify(self.pp, self.streams, event, self.clock())
            return scheme.verify(self.pp, event)

    def encrypt(self, key: Sequence[PublisherKey] | streams.Stream, event: Event) -> bytes:
        """With a publisher's keys, a version-2 event; with its stream, the stream's next
        event (entries reused while values stay in their cells)."""
        with self.meter.timed("encrypt"):
            if isinstance(key, streams.Stream):
                return codec.encode_stream_event(streams.stream_encrypt_and_sign(key, event))
            return codec.encode_event(scheme.encrypt_and_sign(self.pp, key, event))

    def decrypt(self, key: Any, event: AnyEvent) -> Event | None:
        with self.meter.timed("decrypt"):
            try:
                if isinstance(event, StreamEvent):
                    return streams.stream_decrypt(self.pp, key, self.streams, event,
                                                  self.clock())
                return scheme.decrypt(self.pp, key, event)
            except scheme.SchemeError:
                return None

    def open_epoch(self, epoch: int, ends_at: float | None = None) -> None:
        self.streams.admit(epoch)
        if ends_at is not None:
            self.streams.end_epoch_at(epoch, ends_at)

    def drop_epoch(self, epoch: int) -> None:
        self.streams.drop_epoch(epoch)

    def for_peer(self) -> RealCrypto:
        """Same parameters, trust anchor, clock and meter; stream caches of its own."""
        suite = RealCrypto(self.pp, self.server, self.clock)
        suite.meter = self.meter
        return suite
