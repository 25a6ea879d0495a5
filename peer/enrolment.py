"""From key-server answers to the overlay's key material (kits) and the publisher's keys.

The HTTP calls go through :class:`keyserver.client.KeyServerClient`; the decoding and
signature checks through :mod:`keyserver.bundles`. Which credentials become virtual
peers, and which fine tokens each hands its parents, is the overlay's rule
(:mod:`overlay.kits`), the same as in the simulator.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    Credential,
    EventFilter,
    Predicate,
    PublicParams,
    PublisherKey,
    SubscriberKey,
    codec,
    fingerprint,
    load_group,
    root_credential,
    scheme,
)
from ibe_pubsub.keyserver import (
    IssuedRequest,
    KeyServerClient,
    ServerParams,
    SubscriberBundle,
    TransportCertificate,
    decode_params,
    decode_publisher_bundle,
    decode_root_certificate,
    decode_root_token,
    decode_subscriber_bundle,
    decode_transport_certificate,
)
from ibe_pubsub.overlay import RealCrypto, RootKit, SubscriberKit, real_kit
from ibe_pubsub.peer.known_servers import KnownServers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publisher:
    """A publisher's keys for one epoch and the advertisement they were issued for."""

    epoch: int
    epoch_end: float
    advertisement: EventFilter
    keys: tuple[PublisherKey, ...]


def fetch_params(client: KeyServerClient, pinned_key: bytes | None = None,
                 known: KnownServers | None = None) -> ServerParams:
    """Public parameters with the schema signature checked, under the server key pinned or,
    without a pin, the one ``known`` records for the URL (trusted and recorded on first use;
    ServerKeyChanged if it differs). Without either, whichever key the server presents."""
    params = decode_params(load_group(), client.params(), pinned_key)
    if pinned_key is None and known is not None and known.check(client.base_url,
                                                                params.server_key):
        log.warning("first contact with the key server at %s: trusting its signing key %s "
                    "(recorded in %s)", client.base_url, fingerprint(params.server_key),
                    known.path)
    return params


def real_crypto(params: ServerParams) -> RealCrypto:
    return RealCrypto(params.pp, params.server)


def kit_from_bundle(params: ServerParams, bundle: SubscriberBundle, predicate: EventFilter
                    ) -> SubscriberKit:
    """The overlay's kit of a subscriber bundle."""
    return subscriber_kit(params.pp, bundle.epoch, bundle.key, bundle.requests, predicate)


def subscriber_kit(pp: PublicParams, epoch: int, key: SubscriberKey,
                   issued: Sequence[IssuedRequest], predicate: EventFilter) -> SubscriberKit:
    """The overlay's kit of a subscriber key of ``epoch`` and its connection requests, the
    key prepared for decryption."""
    requests = {r.credential: r for r in issued}

    def request_of(credential: Credential) -> tuple[bytes, tuple[bytes, ...]]:
        request = requests[credential]
        return codec.encode_request(request.request), request.secrets

    return real_kit(pp.schema, epoch, predicate, scheme.prepare_subscriber_key(pp, key),
                    request_of)


def enrol_subscriber(client: KeyServerClient, params: ServerParams, predicate: Predicate,
                     next_epoch: bool = False, max_credentials: int | None = 4,
                     fine_depth: int = 1) -> tuple[SubscriberKit, float]:
    """The kit for ``predicate`` (this epoch or the next) and the end of its epoch."""
    doc = client.enrol_subscriber(str(predicate), fine_depth=fine_depth,
                                  max_credentials=max_credentials,
                                  epoch="next" if next_epoch else None)
    bundle = decode_subscriber_bundle(params.pp.group, doc)
    return kit_from_bundle(params, bundle, predicate), bundle.epoch_end


def enrol_root(client: KeyServerClient, params: ServerParams, attribute: str,
               signer: Ed25519PrivateKey, next_epoch: bool = False) -> tuple[RootKit, float]:
    """A certificate over the root's transport key and the whole-domain routing token, as the
    overlay's root kit."""
    raw = signer.public_key().public_bytes_raw()
    doc = client.enrol_root(attribute, base64.b64encode(raw).decode(),
                            epoch="next" if next_epoch else None)
    cert = decode_root_certificate(doc, params.server)
    credential = root_credential(params.pp.schema.attribute(attribute))
    token = decode_root_token(params.pp.group, doc, credential, cert.epoch)
    return RootKit(credential, cert.epoch, cert.to_bytes(), signer, token), \
        float(doc["epoch_end"])


def certify_link_key(client: KeyServerClient, params: ServerParams, key: Ed25519PrivateKey,
                     addresses: list[str], next_epoch: bool = False) -> TransportCertificate:
    """The key server's certificate of ``key`` for this identity at ``addresses`` (none for
    a peer that does not listen), this epoch or the next, checked against the peer-link CA."""
    raw = key.public_key().public_bytes_raw()
    doc = client.enrol_transport(base64.b64encode(raw).decode(), addresses,
                                 epoch="next" if next_epoch else None)
    return decode_transport_certificate(doc, params, raw)


def enrol_publisher(client: KeyServerClient, params: ServerParams, advertisement: Predicate,
                    next_epoch: bool = False, max_credentials: int | None = None) -> Publisher:
    doc = client.enrol_publisher(str(advertisement), max_credentials=max_credentials,
                                 epoch="next" if next_epoch else None)
    bundle = decode_publisher_bundle(params.pp.group, doc)
    return Publisher(bundle.epoch, bundle.epoch_end, advertisement, bundle.keys)
