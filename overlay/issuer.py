"""Local key issuance for simulations and tests: what the key server would hand out.

Which credentials become virtual peers is :func:`overlay.kits.plan_virtual_peers`'s rule,
as for a peer with keys from the key server; here fine credentials are made for the
virtual peers' credentials only.
:class:`RealIssuer` runs the scheme (docs/scheme.md) with a locally drawn master key;
:class:`ModeledIssuer` makes the plaintext objects of :class:`ModeledCrypto`.
Both give :class:`SubscriberKit` and :class:`RootKit` objects and encrypt events.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ibe_pubsub.credentials import (
    Credential,
    Ed25519Server,
    Event,
    Predicate,
    PublicParams,
    RootCertificate,
    Schema,
    Stream,
    StreamWindow,
    codec,
    decompose,
    fine_credentials,
    load_group,
    root_credential,
    scheme,
    virtual_peer_credentials,
)
from ibe_pubsub.overlay.crypto import RootKit, SubscriberKit, VirtualKeys
from ibe_pubsub.overlay.crypto_model import CostTable, ModelDecryptKey, ModeledCrypto
from ibe_pubsub.overlay.crypto_real import RealCrypto
from ibe_pubsub.overlay.kits import Plan, plan_virtual_peers, real_kit


def _plan(schema: Schema, predicate: Predicate, max_credentials: int | None,
          fine_depth: int) -> tuple[list[Credential], Plan]:
    """(every credential of ``predicate``, its virtual peers with their fine credentials)."""
    creds = [c for cs in decompose(schema, predicate, max_credentials).values() for c in cs]
    chosen = virtual_peer_credentials(schema, creds)
    fine = [f for cs in fine_credentials(schema, chosen, fine_depth).values() for f in cs] \
        if fine_depth else []
    return creds, plan_virtual_peers(schema, chosen, fine)


class ModeledIssuer:
    """Issues the HMAC-authenticated plaintext objects of :class:`ModeledCrypto`."""

    def __init__(self, schema: Schema, costs: CostTable | None = None,
                 rng: random.Random | None = None) -> None:
        self.schema = schema
        self.rng = rng or random.Random(0)
        self.crypto = ModeledCrypto(schema, self.rng.randbytes(32), costs)

    def subscriber_kit(self, predicate: Predicate, epoch: int, expires_at: int,
                       max_credentials: int | None = 4, fine_depth: int = 1) -> SubscriberKit:
        creds, plan = _plan(self.schema, predicate, max_credentials, fine_depth)
        c = self.crypto
        virtuals = []
        for cred, fines in plan:
            request, sws = c.make_request(cred, epoch, expires_at, self.rng.randbytes(16))
            virtuals.append(VirtualKeys(
                credential=cred, request=request, sws=sws, token=c.make_token(cred, epoch),
                fine_tokens=tuple(c.make_token(f, epoch) for f in fines), fine=fines,
                opener=(cred, epoch)))
        key = ModelDecryptKey(epoch, tuple(creds))
        return SubscriberKit(epoch, predicate, key, tuple(virtuals))

    def root_kit(self, attribute: str, epoch: int, expires_at: int) -> RootKit:
        cred = root_credential(self.schema.attribute(attribute))
        return RootKit(cred, epoch, self.crypto.make_root_certificate(attribute, epoch,
                                                                      expires_at), None,
                       (cred, epoch))

    def encrypt(self, event: Event, epoch: int, publisher: str = "", now: float = 0.0
                ) -> bytes:
        """The model publishes version-2 events only (``publisher`` and ``now`` serve the
        real issuer's streams)."""
        return self.crypto.encrypt(epoch, event)


#: Expiry of the simulated publishers' session certificates (Unix seconds, far ahead: the
#: peers check it against the wall clock).
CERTIFICATE_EXPIRY = 2**40


class RealIssuer:
    """The scheme (docs/scheme.md) with a master key drawn here and an Ed25519 signing key;
    with ``stream_window``, every publisher publishes a stream (scheme section 15), its
    window measured on the simulator's clock."""

    def __init__(self, schema: Schema, stream_window: StreamWindow | None = None) -> None:
        group = load_group()
        mpk, self.msk = scheme.setup(group)
        self.pp = PublicParams(group, mpk, schema)
        self.schema = schema
        self.server_key = Ed25519PrivateKey.generate()
        self.crypto = RealCrypto(self.pp, Ed25519Server(
            self.server_key.public_key().public_bytes_raw()))
        self._publisher_keys: dict[int, Sequence[scheme.PublisherKey]] = {}
        self.stream_window = stream_window
        self._streams: dict[tuple[str, int], Stream] = {}
        self._now = 0.0

    def subscriber_kit(self, predicate: Predicate, epoch: int, expires_at: int,
                       max_credentials: int | None = 4, fine_depth: int = 1) -> SubscriberKit:
        creds, plan = _plan(self.schema, predicate, max_credentials, fine_depth)
        pp = self.pp
        key = scheme.prepare_subscriber_key(pp, scheme.keygen_subscriber(
            pp, self.msk, epoch, creds, [f for _, fines in plan for f in fines]))

        def request_of(cred: Credential) -> tuple[bytes, tuple[bytes, ...]]:
            request, sws = scheme.build_connection_request(pp, self.server_key, cred, epoch,
                                                           expires_at)
            return codec.encode_request(request), sws

        return real_kit(self.schema, epoch, predicate, key, request_of)

    def root_kit(self, attribute: str, epoch: int, expires_at: int) -> RootKit:
        transport = Ed25519PrivateKey.generate()
        raw = transport.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        cert = RootCertificate.issue(self.server_key, attribute, raw, epoch, expires_at)
        credential = root_credential(self.schema.attribute(attribute))
        return RootKit(credential, epoch, cert.to_bytes(), transport,
                       scheme.keygen_routing_token(self.pp, self.msk, credential, epoch))

    def encrypt(self, event: Event, epoch: int, publisher: str = "", now: float = 0.0
                ) -> bytes:
        """Encrypt and sign with publisher keys for the whole domain of every attribute; as
        ``publisher``'s stream at time ``now`` if streams are on."""
        keys = self._publisher_keys.get(epoch)
        if keys is None:
            keys = self._publisher_keys[epoch] = [
                scheme.keygen_publisher(self.pp, self.msk, root_credential(a), epoch)
                for a in self.schema.attributes]
        if self.stream_window is None:
            return self.crypto.encrypt(keys, event)
        self._now = now
        stream = self._streams.get((publisher, epoch))
        if stream is None:
            stream = self._streams[(publisher, epoch)] = Stream(
                self.pp, keys, self.stream_window, CERTIFICATE_EXPIRY, lambda: self._now)
        return self.crypto.encrypt(stream, event)

