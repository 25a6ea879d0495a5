"""Deterministic test vectors of scheme version 2, for checking other implementations.

Everything an independent implementation needs to replay the scheme's equations is
written out in hex: the MPK and MSK, the keys of one publisher and two subscribers
(each element next to the identity bytes it was hashed from), a 1-attribute and a
3-attribute event (per position the tag, the mask and the position key), a
connection request, and encodings every decoder must refuse. All randomness comes from
:meth:`PairingGroup.seed`, so one seed always gives the same bytes; the key server's
Ed25519 key is derived from the seed too.
The field names are documented in docs/wire-format.md ("Test vectors").

These keys are public by construction: never use them for anything but tests.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials.backend_mcl import (
    BLS12_381_SIZES,
    FIELD_MODULUS,
    FP_BYTES,
    MclNativeGroup,
)
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import enclosing_path
from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G1, G2, GT, Element, GroupError, GroupKind, PairingGroup
from ibe_pubsub.credentials.keys import MasterSecretKey, PublisherKey, SubscriberKey
from ibe_pubsub.credentials.messages import ConnectionRequest, EncryptedEvent
from ibe_pubsub.credentials.schema import Attribute, Schema
from ibe_pubsub.credentials.symmetric import KDF, KDF_PREFIX

#: Bumped whenever a field of the vectors file changes meaning.
VECTORS_FORMAT = 1
VECTORS_FILE = "vectors.json"
EPOCH = 1
#: A fixed expiry (2100-01-01T00:00:00Z) keeps the connection request reproducible.
REQUEST_EXPIRES_AT = 4_102_444_800
#: Position of the matching subscriber's credential on each value path (capped by its length).
SUBSCRIBER_DEPTH = 2
#: Position of the connection request's requester credential (capped likewise).
REQUESTER_DEPTH = 3

THREE = "three_attribute"
ONE = "one_attribute"
PRICE = Attribute("price", "float", min=0.0, max=100.0, bits=5)
THREE_ATTRIBUTE_SCHEMA = Schema("vectors-3", (
    Attribute("symbol", "string", max_length=4),
    PRICE,
    Attribute("qty", "int", min=0, max=31, bits=4),
))
#: The 1-attribute variant shares ``price`` with the 3-attribute schema, so the same keys
#: (whose identity strings name only attribute, role, epoch and credential) serve both.
ONE_ATTRIBUTE_SCHEMA = Schema("vectors-1", (PRICE,))
DEFAULT_VALUES: dict[str, Any] = {"symbol": "IBM", "price": 42.5, "qty": 7}
EVENT_IDS = {ONE: "vectors-event-1", THREE: "vectors-event-3"}
BODIES = {ONE: b"one-attribute event body", THREE: b"three-attribute event body"}
SEED_BYTES = 8


class VectorError(CredentialsError, RuntimeError):
    """The generated vectors contradict the scheme's own algorithms (a bug, not bad input)."""


def seed_bytes(seed: int) -> bytes:
    """The bytes handed to :meth:`PairingGroup.seed`: the seed as 8 bytes big-endian."""
    if not 0 <= seed < 1 << (8 * SEED_BYTES):
        raise GroupError(f"seed must be in 0..2^64-1, got {seed}")
    return seed.to_bytes(SEED_BYTES, "big")


def server_signing_key(seed: int) -> Ed25519PrivateKey:
    """The key server's Ed25519 key, from the seed, so signed requests are reproducible."""
    digest = hashlib.sha256(b"IBE-PUBSUB-V2 test vectors: key server" + seed_bytes(seed))
    return Ed25519PrivateKey.from_private_bytes(digest.digest())


def seeded_group(seed: int) -> MclNativeGroup:
    """A group of its own (seeding is per instance) whose every random byte follows the seed."""
    group = MclNativeGroup()
    group.seed(seed_bytes(seed))
    return group


def _hex(x: Element | bytes) -> str:
    return (x if isinstance(x, bytes) else bytes(x)).hex()


def _scalar(group: PairingGroup, k: int) -> str:
    return k.to_bytes(group.scalar_size, "big").hex()


def _credential(c: Credential) -> dict[str, Any]:
    return {"attribute": c.attribute, "label": c.label(), "position": c.position,
            "bytes": c.encode().hex()}


def _non_matching(c: Credential, value_path: Sequence[Credential]) -> Credential:
    """A credential at ``c``'s position that does not cover the value: the sibling bit
    string (numeric), or a prefix whose last character differs from the value's."""
    if c.kind == "num":
        return Credential(c.attribute, "num", c.path[:-1] + ("1" if c.path[-1] == "0" else "0"))
    text = value_path[-1].path
    base, p = text[:c.position - 1], c.position - 1
    last = text[p] if p < len(text) else ""
    return Credential(c.attribute, "str", base + ("B" if last == "A" else "A"))


def _at_depth(path: Sequence[Credential], depth: int) -> Credential:
    return path[min(depth, len(path) - 1)]


# -- sections of the vectors file -------------------------------------------------------------

def _schema_section(schema: Schema) -> dict[str, Any]:
    return {"id": schema.id, "definition": schema.to_dict(),
            "positions": {a.name: a.positions for a in schema.attributes}}


def _mpk_section(pp: S.PublicParams) -> dict[str, Any]:
    mpk = pp.mpk
    return {"bytes": _hex(codec.encode_mpk(mpk)), "g": _hex(mpk.g), "g_hat": _hex(mpk.g_hat),
            "g2": _hex(mpk.g2), "h": _hex(mpk.h), "hd": _hex(mpk.hd), "Y": _hex(mpk.Y)}


def _msk_section(group: PairingGroup, msk: MasterSecretKey) -> dict[str, Any]:
    return {"bytes": _hex(codec.encode_msk(group, msk)), "alpha": _scalar(group, msk.alpha),
            "phi": _scalar(group, msk.phi), "beta": _scalar(group, msk.beta)}


def _publisher_section(pp: S.PublicParams, keys: Sequence[PublisherKey]) -> dict[str, Any]:
    out = []
    for k in keys:
        identity = S.identity_string(k.credential.attribute, S.PUB, k.epoch, k.credential)
        out.append({"credential": _credential(k.credential), "identity": identity.hex(),
                    "F": _hex(pp.F(identity)), "P1": _hex(k.P1), "P2": _hex(k.P2),
                    "bytes": _hex(codec.encode_publisher_key(k))})
    return {"epoch": EPOCH, "keys": out}


def _subscriber_section(pp: S.PublicParams, key: SubscriberKey) -> dict[str, Any]:
    creds = []
    for k in key.credentials:
        identity = S.identity_string(k.credential.attribute, S.SUB, k.epoch, k.credential)
        creds.append({"credential": _credential(k.credential), "identity": identity.hex(),
                      "F": _hex(pp.F(identity)), "S1": _hex(k.S1), "S2": _hex(k.S2),
                      "T": _hex(k.T)})
    return {"epoch": key.epoch, "D": _hex(key.D), "credentials": creds,
            "bytes": _hex(codec.encode_subscriber_key(key))}


def _attribute_section(pp: S.PublicParams, msk: MasterSecretKey, event: EncryptedEvent, i: int,
                       path: Sequence[Credential]) -> dict[str, Any]:
    """C1, R, E, and per real position its identity, F, K = e(F^phi, C1) and the unmasked
    C2 = F^b (computed with the MSK, as every token holder would)."""
    group, attribute, ct = pp.group, pp.schema.attributes[i], event.attributes[i]
    positions = []
    for j, c in enumerate(path):
        identity = S.identity_string(attribute.name, S.SUB, event.header.epoch, c)
        F = pp.F(identity)
        K = group.pair(group.exp_secret(F, msk.phi), ct.C1)
        mask = KDF(K, S._mask_info(event.header.event_id, i, j), group.sizes[G1])
        positions.append({"position": j, "credential": _credential(c),
                          "identity": identity.hex(), "F": _hex(F), "K": _hex(K),
                          "mask_info": S._mask_info(event.header.event_id, i, j).hex(),
                          "C2": S._xor(ct.E[j], mask).hex()})
    return {"index": i, "name": attribute.name, "positions": attribute.positions,
            "C1": _hex(ct.C1), "R": [r.hex() for r in ct.R], "E": [e.hex() for e in ct.E],
            "path": positions, "padding_positions": list(range(len(path), attribute.positions))}


def _signature_section(pp: S.PublicParams, event: EncryptedEvent) -> list[dict[str, Any]]:
    out = []
    for c, s in zip(event.header.publisher_credentials, event.signatures, strict=True):
        identity = S.identity_string(c.attribute, S.PUB, event.header.epoch, c)
        out.append({"credential": _credential(c), "identity": identity.hex(),
                    "F": _hex(pp.F(identity)), "Sig": _hex(s.Sig), "P2": _hex(s.P2)})
    return out


def _batch_section(pp: S.PublicParams, event: EncryptedEvent, m: Element) -> dict[str, Any]:
    """Deterministic weights (drawn from the seeded stream, odd, 64 bits) and the combined
    sides of the batch equation, which :func:`scheme.verify` draws afresh each time."""
    group = pp.group
    w = [int.from_bytes(group.random_bytes(S.BATCH_WEIGHT_BITS // 8), "big") | 1
         for _ in event.signatures]
    Fs = [pp.F(S.identity_string(c.attribute, S.PUB, event.header.epoch, c))
          for c in event.header.publisher_credentials]
    return {
        "weights": w,
        "Sig_combined": _hex(group.multi_exp([s.Sig for s in event.signatures], w)),
        "F_weighted": [_hex(F ** w_i) for F, w_i in zip(Fs, w, strict=True)],
        "C1_combined": _hex(group.multi_exp([a.C1 for a in event.attributes], w)),
        "Y_power": _hex(pp.mpk.Y ** sum(w)),
        "lhs": _hex(group.pair(group.multi_exp([s.Sig for s in event.signatures], w),
                               pp.mpk.g_hat)),
        "m": _hex(m),
    }


def _decryption_section(pp: S.PublicParams, key: SubscriberKey, event: EncryptedEvent
                        ) -> dict[str, Any]:
    """Y^s as the matching subscriber computes it: e(D, C0) * prod e(C2, S2) / e(S1, C1)."""
    group = pp.group
    pairs: list[tuple[Element, Element]] = [(key.D, event.C0)]
    used = []
    for i, a in enumerate(pp.schema.attributes):
        k, C2 = S.unmask(pp, key, i, a.name, event, event.header.event_id)
        pairs += [(C2, k.S2), (~k.S1, event.attributes[i].C1)]
        used.append({"attribute": a.name, "position": k.credential.position,
                     "credential": k.credential.label()})
    Ys = group.multi_pair(pairs)
    return {"subscriber": "matching", "credentials": used, "Ys": _hex(Ys),
            "payload_key": S.payload_key(Ys, event.header.event_id).hex()}


def _event_section(pp: S.PublicParams, msk: MasterSecretKey, key: SubscriberKey,
                   schema_name: str, plain: S.Event, event: EncryptedEvent) -> dict[str, Any]:
    header_bytes = codec.encode_header(event.header)
    # The same arguments as scheme.verify passes: the digest M hashes onto G1.
    digest = S.signed_digest(header_bytes, event.C0, event.attributes, event.signatures,
                              event.sealed)
    m = pp.M(digest)
    paths = [enclosing_path(pp.schema, a.name, plain.values[a.name])
             for a in pp.schema.attributes]
    return {
        "schema": schema_name,
        "schema_id": pp.schema.id,
        "epoch": event.header.epoch,
        "event_id": event.header.event_id,
        "values": plain.values,
        "body": plain.body.hex(),
        "payload": S.payload(plain).hex(),
        "header": {"bytes": header_bytes.hex(), "publisher_credentials": [
            _credential(c) for c in event.header.publisher_credentials]},
        "encoded": codec.encode_event(event).hex(),
        "C0": _hex(event.C0),
        "sealed": event.sealed.hex(),
        "attributes": [_attribute_section(pp, msk, event, i, path)
                       for i, path in enumerate(paths)],
        "signatures": _signature_section(pp, event),
        "signed_digest": digest.hex(),
        "M": _hex(m),
        "decryption": _decryption_section(pp, key, event),
        "batch_verification": _batch_section(pp, event, m),
    }


def _request_section(pp: S.PublicParams, msk: MasterSecretKey, request: ConnectionRequest,
                     sws: Sequence[bytes], requester: Credential,
                     server_key: Ed25519PrivateKey) -> dict[str, Any]:
    """Real entries name the covering credential they are for, its identity and key; the
    random padding entries past the requester's position are marked ``padding``."""
    group = pp.group
    ancestors = requester.ancestors()
    entries: list[dict[str, Any]] = []
    for j, entry in enumerate(request.entries):
        item: dict[str, Any] = {"position": j, "padding": j >= len(ancestors),
                                "U": _hex(entry.U), "sealed": entry.sealed.hex()}
        if j < len(ancestors):
            c = ancestors[j]
            identity = S.identity_string(c.attribute, S.SUB, request.epoch, c)
            F = pp.F(identity)
            K = group.pair(group.exp_secret(F, msk.phi), entry.U)
            item.update({
                "credential": _credential(c), "identity": identity.hex(), "F": _hex(F),
                "K": _hex(K), "key": KDF(K, S.REQUEST_INFO).hex(),
                "ad": S._request_ad(c.attribute, request.epoch, j).hex(),
                "plaintext": (sws[j] + requester.position.to_bytes(2, "big")).hex()})
        entries.append(item)
    public = server_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {
        "attribute": request.attribute, "epoch": request.epoch,
        "expires_at": request.expires_at, "nonce": request.nonce.hex(),
        "requester": _credential(requester),
        "bytes": codec.encode_request(request).hex(),
        "signed_body": codec.encode_request_body(request).hex(),
        "signature": request.signature.hex(),
        "server_public_key": public.hex(),
        "entries": entries,
    }


# -- encodings a decoder must refuse -----------------------------------------------------------

#: Flag bits of a compressed G1/G2 encoding (top of byte 0), and the x bits below them.
COMPRESSED, INFINITY, SIGN = 0x80, 0x40, 0x20
X_BITS = 381
REJECTION_RULE = (
    "A decoder accepts exactly the bytes the encoder writes: decoding and re-encoding gives "
    "the input back. G1/G2: the compression flag (0x80) is set; with the infinity flag "
    "(0x40) every other bit is zero (c0 00..00), and the scheme refuses that identity too; "
    "otherwise each coordinate is below p and the point lies on the curve and in the "
    "order-q subgroup. GT: every coefficient is below p and the element lies in the order-q "
    "subgroup. mcl decodes c0 00..00 XX for every XX in 01..ff (255 spellings per group) "
    "as the identity, arkworks any padding after an infinity flag: compare the re-encoding.")


def identity_spelling(kind: GroupKind, value: int, position: int = -1) -> bytes:
    """The identity's compressed encoding (c0, then zeros) with ``value`` at ``position``
    (not 0): non-canonical for every non-zero value. mcl decodes the last-byte spellings
    as the identity, which is what made forged events route everywhere."""
    out = bytearray(BLS12_381_SIZES[kind])
    out[0] = COMPRESSED | INFINITY
    out[position] = value
    return bytes(out)


def _plus_p(encoding: bytes, offset: int) -> bytes | None:
    """``encoding`` with p added to the coordinate at byte ``offset``, its flag bits kept;
    None when the sum reaches 2^381 and would run into the flags."""
    field = encoding[offset:offset + FP_BYTES]
    flags = field[0] & (COMPRESSED | INFINITY | SIGN)
    x = int.from_bytes(field, "big") & ((1 << X_BITS) - 1)
    if x + FIELD_MODULUS >= 1 << X_BITS:
        return None
    unreduced = bytearray((x + FIELD_MODULUS).to_bytes(FP_BYTES, "big"))
    unreduced[0] |= flags
    return encoding[:offset] + bytes(unreduced) + encoding[offset + FP_BYTES:]


def _unreduced(group: PairingGroup, kind: GroupKind, offset: int) -> bytes:
    """A valid point's encoding with p added to one coordinate, from the first multiple of
    the generator where that fits."""
    candidates = (_plus_p(bytes(group.generator(kind) ** k), offset) for k in itertools.count(1))
    return next(c for c in candidates if c is not None)


def _is_square(v: int) -> bool:
    return pow(v % FIELD_MODULUS, (FIELD_MODULUS - 1) // 2, FIELD_MODULUS) == 1


def _fp2_mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """(a0 + a1 u)(b0 + b1 u) with u^2 = -1."""
    return ((a[0] * b[0] - a[1] * b[1]) % FIELD_MODULUS,
            (a[0] * b[1] + a[1] * b[0]) % FIELD_MODULUS)


def _has_point(kind: GroupKind, k: int) -> bool:
    """Whether x = k (G1) or x = k + u (G2) is the x of a curve point: x^3 + b is a square
    (in Fp2 iff its norm is a square in Fp, as p = 3 mod 4); b = 4, or 4 + 4u."""
    if kind is G1:
        return _is_square(k ** 3 + 4)
    x = (k, 1)
    cube = _fp2_mul(_fp2_mul(x, x), x)
    return _is_square((cube[0] + 4) ** 2 + (cube[1] + 4) ** 2)


def _x_with_curve_point(kind: GroupKind, exists: bool) -> bytes:
    """The compressed encoding (either sign) of the first such x for which a curve point
    exists, or does not. One that exists lies outside the order-q subgroup: the cofactor
    is large."""
    k = next(k for k in itertools.count(1) if _has_point(kind, k) == exists)
    x = k.to_bytes(FP_BYTES, "big")
    if kind is G2:
        x = (1).to_bytes(FP_BYTES, "big") + x  # x1 = 1, then x0 = k
    return bytes([x[0] | COMPRESSED]) + x[1:]


def point_outside_subgroup(kind: GroupKind) -> bytes:
    """A curve point outside G1 or G2, compressed: it parses only without the subgroup
    check."""
    return _x_with_curve_point(kind, exists=True)


def _point_rejections(group: PairingGroup, kind: GroupKind) -> list[dict[str, str]]:
    size = group.sizes[kind]
    valid = bytes(group.generator(kind))
    out = [("identity", identity_spelling(kind, 0)),
           *(("non_canonical_identity", identity_spelling(kind, v)) for v in (0x01, 0x80, 0xFF)),
           *(("non_canonical_identity", identity_spelling(kind, 0x01, j))
             for j in (1, size // 2)),
           ("identity_with_sign_flag", bytes([COMPRESSED | INFINITY | SIGN]) + bytes(size - 1)),
           ("identity_without_compression_flag", bytes([INFINITY]) + bytes(size - 1)),
           ("compression_flag_cleared", bytes([valid[0] & ~COMPRESSED]) + valid[1:]),
           ("x_not_reduced", _unreduced(group, kind, 0))]
    if kind is G2:
        out += [("x0_not_reduced", _unreduced(group, kind, FP_BYTES)),
                ("flag_in_x0", valid[:FP_BYTES] + bytes([valid[FP_BYTES] | COMPRESSED])
                 + valid[FP_BYTES + 1:])]
    out += [("not_on_curve", _x_with_curve_point(kind, exists=False)),
            ("not_in_subgroup", point_outside_subgroup(kind))]
    return [{"reason": reason, "bytes": data.hex()} for reason, data in out]


def _gt_rejections(group: PairingGroup) -> list[dict[str, str]]:
    generator = bytes(group.generator(GT))
    first = int.from_bytes(generator[:FP_BYTES], "little") + FIELD_MODULUS
    two = (2).to_bytes(FP_BYTES, "little") + bytes(group.sizes[GT] - FP_BYTES)
    return [{"reason": "coefficient_not_reduced",
             "bytes": (first.to_bytes(FP_BYTES, "little") + generator[FP_BYTES:]).hex()},
            {"reason": "not_in_subgroup", "bytes": two.hex()}]


def rejected_encodings(group: PairingGroup) -> dict[str, Any]:
    """Encodings every decoder must refuse, per group with the reason: built from the
    curve's constants only (no seed). Refuses to list one the group accepts."""
    out: dict[str, Any] = {
        "rule": REJECTION_RULE,
        "identity_spellings": "c0, then zero bytes, then any of 01..ff: 48 bytes in G1, 96 in "
                              "G2; 255 non-canonical spellings of the identity per group",
        G1.value: _point_rejections(group, G1), G2.value: _point_rejections(group, G2),
        GT.value: _gt_rejections(group)}
    for kind in (G1, G2, GT):
        for entry in out[kind.value]:
            try:
                group.deserialize(kind, bytes.fromhex(entry["bytes"]))
            except GroupError:
                continue
            raise VectorError(f"{kind.value} accepts the {entry['reason']} encoding")
    return out


def _self_check(events: Sequence[tuple[S.PublicParams, S.Event, EncryptedEvent]],
                matching: SubscriberKey, other: SubscriberKey, request: ConnectionRequest,
                sws: Sequence[bytes]) -> None:
    """Refuse to write vectors the scheme itself would not accept: they would mislead."""
    for pp, plain, event in events:
        if not S.verify(pp, event):
            raise VectorError(f"event {plain.event_id} does not verify")
        out = S.decrypt(pp, matching, event)
        if out.values != plain.values or out.body != plain.body:
            raise VectorError(f"event {plain.event_id} decrypts to something else")
        try:
            S.decrypt(pp, other, event)
        except S.DecryptionError:
            pass
        else:
            raise VectorError(f"the non-matching subscriber decrypts {plain.event_id}")
    pp = events[-1][0]
    token = next(k for k in matching.credentials if k.credential.attribute == request.attribute)
    opening = S.open_connection_request(pp, token.token, request)
    if opening is None or opening.sw != sws[token.credential.position]:
        raise VectorError("the matching subscriber cannot open the connection request")


def build_vectors(seed: int = 0, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole vectors document for ``seed``; ``values`` override the 3-attribute event's
    default values (attributes left out keep theirs). The 1-attribute event carries the
    same price, so the matching subscriber matches both events."""
    schema = THREE_ATTRIBUTE_SCHEMA
    values3 = schema.validate_values({**DEFAULT_VALUES, **(values or {})})
    values1 = ONE_ATTRIBUTE_SCHEMA.validate_values({PRICE.name: values3[PRICE.name]})
    group = seeded_group(seed)
    server_key = server_signing_key(seed)
    mpk, msk = S.setup(group)
    pp3 = S.PublicParams(group, mpk, schema)
    pp1 = S.PublicParams(group, mpk, ONE_ATTRIBUTE_SCHEMA)
    paths = {a.name: enclosing_path(schema, a.name, values3[a.name]) for a in schema.attributes}

    publisher = [S.keygen_publisher(pp3, msk, paths[n][1], EPOCH) for n in schema.names]
    matching_creds = [_at_depth(paths[n], SUBSCRIBER_DEPTH) for n in schema.names]
    other_creds = [_non_matching(c, paths[c.attribute]) for c in matching_creds]
    matching = S.keygen_subscriber(pp3, msk, EPOCH, matching_creds)
    other = S.keygen_subscriber(pp3, msk, EPOCH, other_creds)

    plain3 = S.Event(EVENT_IDS[THREE], values3, BODIES[THREE])
    plain1 = S.Event(EVENT_IDS[ONE], values1, BODIES[ONE])
    event3 = S.encrypt_and_sign(pp3, publisher, plain3)
    event1 = S.encrypt_and_sign(pp1, publisher, plain1)

    string_attribute = next(a.name for a in schema.attributes if not a.is_numeric)
    requester = _at_depth(paths[string_attribute], REQUESTER_DEPTH)
    request, sws = S.build_connection_request(pp3, server_key, requester, EPOCH,
                                              REQUEST_EXPIRES_AT)
    _self_check([(pp1, plain1, event1), (pp3, plain3, event3)], matching, other, request, sws)

    return {
        "format": "ibe-pubsub test vectors",
        "format_version": VECTORS_FORMAT,
        "scheme_version": mpk.version,
        "warning": "every secret here is derived from the seed: for tests only",
        "seed": seed,
        "seed_bytes": seed_bytes(seed).hex(),
        "curve": mpk.curve,
        "encodings": {
            "G1": "ZCash compressed, 48 bytes", "G2": "ZCash compressed, 96 bytes",
            "GT": "12 Fp coefficients (arkworks order), 48 bytes little-endian each, 576 bytes",
            "scalar": "32 bytes big-endian"},
        "hash_to_g1": {"suite": "BLS12381G1_XMD:SHA-256_SSWU_RO_",
                       "F_dst": S.DST_ID.decode(), "M_dst": S.DST_MSG.decode()},
        "kdf": {"algorithm": "HKDF-SHA256", "salt": None,
                "info_prefix": KDF_PREFIX.decode()},
        "epoch": EPOCH,
        "gt_generator": _hex(group.pair(mpk.g, mpk.g_hat)),
        "rejected_encodings": rejected_encodings(group),
        "schemas": {THREE: _schema_section(schema), ONE: _schema_section(ONE_ATTRIBUTE_SCHEMA)},
        "mpk": _mpk_section(pp3),
        "msk": _msk_section(group, msk),
        "publisher": _publisher_section(pp3, publisher),
        "subscribers": {"matching": _subscriber_section(pp3, matching),
                        "non_matching": _subscriber_section(pp3, other)},
        "events": {ONE: _event_section(pp1, msk, matching, ONE, plain1, event1),
                   THREE: _event_section(pp3, msk, matching, THREE, plain3, event3)},
        "connection_request": _request_section(pp3, msk, request, sws, requester, server_key),
    }


def vectors_json(vectors: Mapping[str, Any]) -> bytes:
    """Stable text (fixed key order and indentation): equal vectors give equal bytes."""
    return (json.dumps(vectors, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
