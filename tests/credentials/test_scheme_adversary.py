"""Adversary tests of scheme version 2: attacks from public data only.

The attacker has the MPK, the schema, the bytes of events and connection requests (read back
with the codec) and the hash F. Every attack is one function, run twice: on a control built
here in the style of version 1, where it must succeed, so no test passes vacuously; and on
real version 2 output, where it must fail. Controls and version 2 ciphertexts share the
randomness the test draws (``b``, ``t``) wherever the scheme lets the test choose it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import decompose, enclosing_path, value_credential
from ibe_pubsub.credentials.groups import G1, G2, Element, GroupError
from ibe_pubsub.credentials.messages import EncryptedEvent
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import Attribute, Schema
from ibe_pubsub.credentials.strings import OTHER_CHAR
from ibe_pubsub.credentials.symmetric import H4, KDF, AuthenticationFailed, open_sealed, seal

EPOCH = 7
EXPIRES = 2**40
SCHEMA = Schema.from_dict({
    "name": "adversary",
    "attributes": [
        {"name": "symbol", "type": "string", "max_length": 4, "alphabet": "IBM"},
        {"name": "price", "type": "float", "min": 0.0, "max": 100.0, "bits": 5},
        {"name": "qty", "type": "int", "min": 0, "max": 15, "bits": 4},
    ],
})
ONE = Schema.from_dict({
    "name": "adversary-one",
    "attributes": [{"name": "qty", "type": "int", "min": 0, "max": 15, "bits": 4}],
})
VALUES = {"symbol": "IB", "price": 42.0, "qty": 9}


@dataclass(frozen=True)
class World:
    system: S.PublicParams  # the key server's and publishers' parameters
    public: S.PublicParams  # the attacker's: MPK read back from its encoding, and the schema
    msk: object
    publisher: tuple


def make_world(schema: Schema) -> World:
    group = load_group()
    mpk, msk = S.setup(group)
    system = S.PublicParams(group, mpk, schema)
    public = S.PublicParams(group, codec.decode_mpk(group, codec.encode_mpk(mpk)), schema)
    everything = decompose(schema, parse_predicate(schema, ""))
    publisher = tuple(S.keygen_publisher(system, msk, c, EPOCH)
                      for cs in everything.values() for c in cs)
    return World(system, public, msk, publisher)


@pytest.fixture(scope="module")
def world() -> World:
    return make_world(SCHEMA)


@pytest.fixture(scope="module")
def world_one() -> World:
    return make_world(ONE)


def on_wire(w: World, event: EncryptedEvent) -> EncryptedEvent:
    """What the attacker holds of an event: its encoding, decoded with the codec."""
    return codec.decode_event(w.public.group, codec.encode_event(event))


def publish(w: World, values: dict, event_id: str = "ev-1", body: bytes = b"body"
            ) -> EncryptedEvent:
    return S.encrypt_and_sign(w.system, w.publisher, S.Event(event_id, values, body))


# -- the attacker's view of an attribute, and credential spaces ----------------------------

@dataclass(frozen=True)
class Seen:
    """One attribute of an event as an eavesdropper sees it. ``points`` are the 48-byte
    per-position strings: C2_ij in clear (version 1) or E_ij (version 2)."""

    event_id: str
    epoch: int
    i: int
    attribute: Attribute
    C0: Element
    C1: Element
    points: tuple[bytes, ...]
    tags: tuple[bytes, ...]


def seen_v2(pp: S.PublicParams, event: EncryptedEvent) -> list[Seen]:
    h = event.header
    return [Seen(h.event_id, h.epoch, i, a, event.C0, ct.C1, ct.E, ct.R)
            for i, (a, ct) in enumerate(zip(pp.schema.attributes, event.attributes,
                                            strict=True))]


def F_sub(pp: S.PublicParams, c: Credential, epoch: int = EPOCH) -> Element:
    return pp.F(S.identity_string(c.attribute, S.SUB, epoch, c))


def draw_b(pp: S.PublicParams) -> list[int]:
    return [pp.group.random_scalar() for _ in pp.schema.attributes]


def v1_control(pp: S.PublicParams, values: dict, event_id: str, b: Sequence[int]) -> list[Seen]:
    """A version 1 event built by the test: C1_i = ĝ^b_i, C2_ij = F_ij^b_i in clear (only the
    path's positions, no padding), R_ij = H4(e(F_ij, h)^b_i), C0 = h^(sum b)."""
    C0 = pp.mpk.h ** (sum(b) % pp.group.order)
    out = []
    for i, (a, b_i) in enumerate(zip(pp.schema.attributes, b, strict=True)):
        path = enclosing_path(pp.schema, a.name, values[a.name])
        out.append(Seen(event_id, EPOCH, i, a, C0, pp.mpk.g_hat ** b_i,
                        tuple(bytes(F_sub(pp, c) ** b_i) for c in path),
                        tuple(H4(pp.group.pair(F_sub(pp, c), pp.mpk.h) ** b_i) for c in path)))
    return out


def v2_same_b(pp: S.PublicParams, values: dict, event_id: str, b: Sequence[int]) -> list[Seen]:
    """The version 2 ciphertext of the same values under the same b_i (S.encrypt_attribute),
    with C0 = hd^(sum b) as encrypt_and_sign computes it."""
    C0 = pp.mpk.hd ** (sum(b) % pp.group.order)
    out = []
    for i, (a, b_i) in enumerate(zip(pp.schema.attributes, b, strict=True)):
        path = enclosing_path(pp.schema, a.name, values[a.name])
        ct = S.encrypt_attribute(pp, a, i, EPOCH, event_id, path, b_i)
        out.append(Seen(event_id, EPOCH, i, a, C0, ct.C1, ct.E, ct.R))
    return out


def chars(a: Attribute) -> str:
    assert a.alphabet is not None, "a guessable string attribute needs an alphabet"
    return a.alphabet + OTHER_CHAR


def credential_space(a: Attribute) -> dict[int, tuple[Credential, ...]]:
    """Every credential of a small attribute, by position: what a guesser enumerates."""
    if a.is_numeric:
        return {j: tuple(Credential(a.name, "num", "".join(p)) for p in product("01", repeat=j))
                for j in range(a.positions)}
    assert a.max_length is not None
    prefixes = {n: ["".join(p) for p in product(chars(a), repeat=n)]
                for n in range(a.max_length + 1)}
    return {j: tuple([Credential(a.name, "str", p) for p in prefixes.get(j, [])]
                     + [Credential(a.name, "str", p, terminal=True)
                        for p in prefixes.get(j - 1, [])])
            for j in range(a.positions)}


def children(a: Attribute, c: Credential) -> tuple[Credential, ...]:
    """The credentials of position len(c) + 1 under c."""
    if a.is_numeric:
        return tuple(Credential(a.name, "num", c.path + d)
                     for d in "01") if len(c.path) < (a.bits or 0) else ()
    if c.terminal:
        return ()
    deeper = [Credential(a.name, "str", c.path + ch)
              for ch in chars(a)] if len(c.path) < (a.max_length or 0) else []
    return (Credential(a.name, "str", c.path, terminal=True), *deeper)


# -- attack (a): the pairing test on a per-position point ----------------------------------

@dataclass
class Tally:
    """What an attack spent: candidate points read, those that are no G1 element (a failure
    of the attack), pairing tests run on the others, guesses tried."""

    read: int = 0
    unparsed: int = 0
    tested: int = 0
    guesses: int = 0
    hits: list = field(default_factory=list)


def read_g1(pp: S.PublicParams, data: bytes) -> Element | None:
    try:
        return pp.group.deserialize(G1, data)
    except GroupError:
        return None


def reveals(pp: S.PublicParams, seen: Seen, j: int, guess: Credential, tally: Tally) -> bool:
    """Leak (a): does the string at position j, read as a G1 point X as it stands or unmasked
    with KDF(e(F(guess), V)) for every public G2 element V (C1, C0, h, hd), pass
    e(X, ĝ) == e(F(guess), C1_i), i.e. is it F(guess)^b_i?"""
    group = pp.group
    F = F_sub(pp, guess, seen.epoch)
    size = group.sizes[G1]
    info = S._mask_info(seen.event_id, seen.i, j)
    masks = [bytes(size)] + [KDF(group.pair(F, V), info, size)
                             for V in (seen.C1, seen.C0, pp.mpk.h, pp.mpk.hd)]
    tally.guesses += 1
    target = None
    for mask in masks:
        tally.read += 1
        X = read_g1(pp, S._xor(seen.points[j], mask))
        if X is None:
            tally.unparsed += 1
            continue
        tally.tested += 1
        target = target or group.pair(F, seen.C1)
        if group.pair(X, pp.g_hat) == target:
            tally.hits.append((seen.attribute.name, j, guess))
            return True
    return False


def pairing_test_attack(pp: S.PublicParams, seen: Seen, guesses: dict[int, Sequence[Credential]]
                        ) -> Tally:
    """Run :func:`reveals` on every position with the given guesses."""
    tally = Tally()
    for j in range(len(seen.points)):
        for guess in guesses.get(j, ()):
            reveals(pp, seen, j, guess, tally)
    return tally


def test_no_masked_position_passes_the_pairing_test(world):
    """Leak (a): E_ij read as a point (raw or unmasked with public keys) is never F(c_j)^b_i;
    the v1 C2_ij and a mask under a public key are caught."""
    pp = world.public
    b = draw_b(pp)
    correct = {a.name: dict(enumerate(enclosing_path(SCHEMA, a.name, VALUES[a.name])))
               for a in SCHEMA.attributes}
    # control: version 1 puts C2_ij in clear; every position gives its credential away
    for seen in v1_control(pp, VALUES, "ev-1", b):
        tally = pairing_test_attack(pp, seen, {j: [c] for j, c in correct[seen.attribute.name]
                                               .items()})
        assert len(tally.hits) == len(seen.points) == len(correct[seen.attribute.name])
    # control: a mask under a key derivable from public data, KDF(e(F, C1)), is caught too
    for seen in v2_same_b(pp, VALUES, "ev-1", b):
        weak = tuple(S._xor(bytes(F_sub(pp, c) ** b[seen.i]), KDF(
            pp.group.pair(F_sub(pp, c), seen.C1), S._mask_info("ev-1", seen.i, j), 48))
            for j, c in correct[seen.attribute.name].items())
        tally = pairing_test_attack(pp, dataclasses.replace(seen, points=weak),
                                    {j: [c] for j, c in correct[seen.attribute.name].items()})
        assert len(tally.hits) == len(weak)
    # version 2, same b: nothing; but the position key K_ij unmasks exactly the v1 C2_ij
    for v1, v2 in zip(v1_control(pp, VALUES, "ev-1", b), v2_same_b(pp, VALUES, "ev-1", b),
                      strict=True):
        assert v1.C1 == v2.C1 and v1.tags == v2.tags[:len(v1.tags)]
        tally = pairing_test_attack(pp, v2, {j: [c] for j, c in correct[v2.attribute.name]
                                             .items()})
        assert tally.hits == [] and tally.read == tally.unparsed + tally.tested
        for j, c in correct[v2.attribute.name].items():
            K = pp.group.pair(F_sub(pp, c), pp.mpk.h) ** b[v2.i]
            assert S._xor(v2.points[j], KDF(K, S._mask_info("ev-1", v2.i, j), 48)) == \
                v1.points[j]
    # version 2, a real event off the wire: every E value, the padding ones included
    event = on_wire(world, publish(world, VALUES))
    unparsed = read = 0
    for seen in seen_v2(pp, event):
        assert len(seen.points) == seen.attribute.positions
        space = credential_space(seen.attribute)
        guesses = {j: [correct[seen.attribute.name][j]] if j in correct[seen.attribute.name]
                   else space[j][:8] for j in range(len(seen.points))}
        tally = pairing_test_attack(pp, seen, guesses)
        assert tally.hits == [], tally.hits
        unparsed, read = unparsed + tally.unparsed, read + tally.read
    # a 48-byte string parses as a G1 point of the prime-order subgroup with negligible
    # probability: the attack fails on (almost) every candidate before any pairing
    assert read > 0 and unparsed >= read - 2, (unparsed, read)


# -- attack (b): C0 as a tag tester ----------------------------------------------------------

def c0_tag_attack(pp: S.PublicParams, seen: Sequence[Seen], extra: Sequence[Element] = ()
                  ) -> set[tuple[str, int, Credential]]:
    """Leak (b): H4(e(F(guess), V)) == R_ij for V = C0 (and every other public G2 element of
    the event and the MPK), for every credential of the schema."""
    group = pp.group
    publics = [seen[0].C0, *(s.C1 for s in seen), *extra, pp.mpk.h, pp.mpk.hd, pp.mpk.g_hat]
    found = set()
    for s in seen:
        tags = {tag: j for j, tag in enumerate(s.tags)}
        for guesses in credential_space(s.attribute).values():
            for guess in guesses:
                F = F_sub(pp, guess, s.epoch)
                for V in publics:
                    j = tags.get(H4(group.pair(F, V)))
                    if j is not None:
                        found.add((s.attribute.name, j, guess))
    return found


def test_c0_tests_no_tag_of_a_one_attribute_event(world_one):
    """Leak (b): with one attribute, v1's C0 = h^b made H4(e(F(guess), C0)) == R_j; v2's
    C0 = hd^b does not."""
    pp = world_one.public
    values = {"qty": 9}
    path = enclosing_path(ONE, "qty", 9)
    expected = {("qty", j, c) for j, c in enumerate(path)}
    b = draw_b(pp)
    # control: v1's C0 = h^b with v2's own tags under the same b: the whole path falls out
    v2 = v2_same_b(pp, values, "ev-1", b)
    v1 = [dataclasses.replace(s, C0=pp.mpk.h ** b[0]) for s in v2]
    assert c0_tag_attack(pp, v1) == expected
    # version 2 under the same b: C0 = hd^b tests nothing
    assert pp.mpk.hd ** b[0] == v2[0].C0
    assert c0_tag_attack(pp, v2) == set()
    # a real one-attribute event off the wire, its P2 thrown in
    event = on_wire(world_one, publish(world_one, values))
    assert c0_tag_attack(pp, seen_v2(pp, event), [s.P2 for s in event.signatures]) == set()


# -- attack (c): connection-request entries ---------------------------------------------------

@dataclass(frozen=True)
class SeenEntry:
    """A request entry as an eavesdropper sees it: its G1 and G2 elements and its box."""

    g1: tuple[Element, ...]
    g2: tuple[Element, ...]
    box: bytes


def request_attack(pp: S.PublicParams, attribute: str, epoch: int,
                   entries: Sequence[SeenEntry]) -> set[tuple[int, Credential]]:
    """Leak (c) and the natural public tests on entry j, for every credential c of position j:
    e(X, ĝ) == e(F(c), V) for X a G1 element of the entry or the MPK and V a G2 element of the
    entry; and opening the box with KDF(e(F(c), V), "cr") for V in the entry, h, hd, ĝ."""
    group, mpk = pp.group, pp.mpk
    space = credential_space(pp.schema.attribute(attribute))
    found = set()
    for j, entry in enumerate(entries):
        lhs = [group.pair(X, pp.g_hat) for X in (*entry.g1, mpk.g, mpk.g2)]
        ad = S._request_ad(attribute, epoch, j)
        for guess in space[j]:
            F = F_sub(pp, guess, epoch)
            if any(group.pair(F, V) in lhs for V in entry.g2):
                found.add((j, guess))
            for V in (*entry.g2, mpk.h, mpk.hd, mpk.g_hat):
                try:
                    open_sealed(KDF(group.pair(F, V), S.REQUEST_INFO), entry.box, ad)
                except AuthenticationFailed:
                    continue
                found.add((j, guess))
    return found


def v1_entries(pp: S.PublicParams, credential: Credential, ts: Sequence[int]) -> list[SeenEntry]:
    """Version 1 entries built by the test: (ĝ^t, F^t, h^t, AEAD_{KDF(Y^t)}(SW)), no padding."""
    out = []
    for j, (c, t) in enumerate(zip(credential.ancestors(), ts, strict=False)):
        box = seal(KDF(pp.mpk.Y ** t, b"connection-request"), bytes(32),
                   S._request_ad(c.attribute, EPOCH, j))
        out.append(SeenEntry((F_sub(pp, c) ** t,), (pp.mpk.g_hat ** t, pp.mpk.h ** t), box))
    return out


def weak_entries(pp: S.PublicParams, credential: Credential, ts: Sequence[int]
                 ) -> list[SeenEntry]:
    """Entries (ĝ^t, box) whose key lacks the master secret, KDF(e(F, ĝ)^t) or KDF(e(F, h)):
    the box-opening part of the attack must open them."""
    out = []
    for j, (c, t) in enumerate(zip(credential.ancestors(), ts, strict=False)):
        key = pp.group.pair(F_sub(pp, c), pp.mpk.g_hat) ** t if j % 2 else pp.group.pair(
            F_sub(pp, c), pp.mpk.h)
        box = seal(KDF(key, S.REQUEST_INFO), bytes(S.REQUEST_PLAINTEXT_BYTES),
                   S._request_ad(c.attribute, EPOCH, j))
        out.append(SeenEntry((), (pp.mpk.g_hat ** t,), box))
    return out


def request_on_wire(w: World, credential: Credential):
    request, sws = S.build_connection_request(w.system, Ed25519PrivateKey.generate(), credential,
                                              EPOCH, EXPIRES)
    data = codec.encode_request(request)
    return codec.decode_request(w.public.group, data), data, sws


def test_request_entries_test_no_credential(world):
    """Leak (c): v1's (ĝ^t, F^t) entry is caught by e(F_t, ĝ) == e(F(c), ĝ^t); v2's (U, box)
    answers no pairing test and opens under no key derivable from public data."""
    pp = world.public
    requester = Credential("price", "num", "0110")
    expected = {(j, c) for j, c in enumerate(requester.ancestors())}
    ts = [pp.group.random_scalar() for _ in requester.ancestors()]
    # controls: v1 entries give the whole credential away; so do boxes under weak keys
    assert request_attack(pp, "price", EPOCH, v1_entries(pp, requester, ts)) == expected
    assert request_attack(pp, "price", EPOCH, weak_entries(pp, requester, ts)) == expected
    # version 2 off the wire: nothing, though a token holder does open the real entries
    request, _, _ = request_on_wire(world, requester)
    seen = [SeenEntry((), (e.U,), e.sealed) for e in request.entries]
    assert request_attack(pp, "price", EPOCH, seen) == set()
    for c in requester.ancestors():
        token = S.keygen_routing_token(world.system, world.msk, c, EPOCH)
        opened = S.open_connection_request(world.system, token.blinded(), request)
        assert opened is not None and opened.position == requester.position


def test_requests_hide_the_requester_position(world):
    """Leak (c), size side: a coarse and a fine credential of one attribute give as many
    entries, of one size, all with a valid U; v1's entry count gave the position away."""
    pp = world.public
    for coarse, fine in [
            (Credential("price", "num", "0"), Credential("price", "num", "01101")),
            (Credential("symbol", "str", ""), Credential("symbol", "str", "IBM", terminal=True))]:
        positions = pp.schema.attribute(coarse.attribute).positions
        # control: v1 requests had one entry per ancestor
        ts = [1] * positions
        assert len(v1_entries(pp, coarse, ts)) != len(v1_entries(pp, fine, ts))
        shapes, lengths = set(), set()
        for credential in (coarse, fine):
            request, data, _ = request_on_wire(world, credential)
            assert len(request.entries) == positions > credential.position
            lengths.add(len(data))
            for entry in request.entries:
                shapes.add((len(bytes(entry.U)), len(entry.sealed)))
                pp.group.deserialize(G2, bytes(entry.U))  # padding U is a valid point too
        assert len(shapes) == 1 and len(lengths) == 1, (shapes, lengths)


# -- property (d): routing tokens off the path -----------------------------------------------

def token_matches(pp: S.PublicParams, T: Element, event: EncryptedEvent
                  ) -> set[tuple[int, int]]:
    """Every (attribute i, position j) whose tag equals H4(e(T, C1_i))."""
    out = set()
    for i, ct in enumerate(event.attributes):
        tag = H4(pp.group.pair(T, ct.C1))
        out |= {(i, j) for j, r in enumerate(ct.R) if r == tag}
    return out


def test_off_path_tokens_match_no_tag(world):
    """Property (d): a token off the value's path matches no tag of any attribute at any
    position; a token on the path (control) matches exactly its own."""
    pp = world.public
    event = on_wire(world, publish(world, VALUES))
    checked = 0
    for i, a in enumerate(SCHEMA.attributes):
        path = enclosing_path(SCHEMA, a.name, VALUES[a.name])
        for guesses in credential_space(a).values():
            for c in guesses:
                token = S.keygen_routing_token(world.system, world.msk, c, EPOCH)
                on_path = c.position < len(path) and path[c.position] == c
                expected = {(i, c.position)} if on_path else set()
                assert token_matches(pp, token.T, event) == expected, c
                assert S.route_test(pp, token.blinded(), event) is on_path, c
                checked += 1
    assert checked == sum(len(g) for a in SCHEMA.attributes
                          for g in credential_space(a).values())


# -- attack (a) as value recovery ------------------------------------------------------------

def walk(pp: S.PublicParams, seen: Seen, tally: Tally) -> dict[int, Credential]:
    """Recover a value by walking its credential path: at each position keep the child of
    the last recovered credential that passes :func:`reveals` (every credential of the
    position once the path is lost). Cost: at most the attribute's credential space."""
    space = credential_space(seen.attribute)
    found: dict[int, Credential] = {}
    last: Credential | None = None
    for j in range(len(seen.points)):
        candidates = children(seen.attribute, last) if last is not None else space[j]
        last = next((c for c in candidates if reveals(pp, seen, j, c, tally)), None)
        if last is not None:
            found[j] = last
    return found


def test_value_recovery_walk(world):
    """The issue's attack: walking each attribute's path with the pairing test recovers every
    value of a 3-attribute v1 event, and nothing of a v2 one."""
    pp = world.public
    values = {"symbol": "MIB", "price": 73.5, "qty": 4}
    b = draw_b(pp)
    bound = {a.name: sum(len(g) for g in credential_space(a).values()) for a in SCHEMA.attributes}
    # control: v1 gives every value's finest credential, the terminal of "MIB" included
    for seen in v1_control(pp, values, "ev-9", b):
        tally = Tally()
        found = walk(pp, seen, tally)
        name = seen.attribute.name
        assert found == dict(enumerate(enclosing_path(SCHEMA, name, values[name])))
        assert found[max(found)] == value_credential(SCHEMA, name, values[name])
        assert tally.guesses <= bound[name]
    # version 2: same b, and a real event off the wire
    for seen in [*v2_same_b(pp, values, "ev-9", b),
                 *seen_v2(pp, on_wire(world, publish(world, values, "ev-9")))]:
        tally = Tally()
        assert walk(pp, seen, tally) == {}
        assert tally.guesses == bound[seen.attribute.name]  # searched the whole space
        assert tally.read == tally.unparsed + tally.tested


# -- string length ----------------------------------------------------------------------------

def entry_counts(seen: Sequence[Seen]) -> tuple[tuple[int, int], ...]:
    """What the lists of an event say about its values: (points, tags) per attribute."""
    return tuple((len(s.points), len(s.tags)) for s in seen)


def test_string_length_not_in_the_positions(world):
    """Two events whose string values differ in length carry as many R and E entries, of the
    same sizes; v1's lists (control) had one entry per path position."""
    pp = world.public
    short, long = dict(VALUES, symbol="I"), dict(VALUES, symbol="IBMI")
    b = draw_b(pp)
    assert entry_counts(v1_control(pp, short, "e", b)) != entry_counts(
        v1_control(pp, long, "e", b))
    events = [on_wire(world, publish(world, v, "e")) for v in (short, long)]
    seen = [seen_v2(pp, e) for e in events]
    assert entry_counts(seen[0]) == entry_counts(seen[1])
    assert {len(p) for s in seen for a in s for p in a.points} == {48}
    assert {len(t) for s in seen for a in s for t in a.tags} == {32}


def test_string_length_not_in_the_encoded_size(world):
    """Two events whose string values differ in length (same other values and body) encode
    to the same number of bytes (the payload is padded to a bucket); control: the size does
    tell apart two bodies a bucket apart."""
    bodies = {len(codec.encode_event(publish(world, VALUES, "e", body)))
              for body in (b"ab", b"a" * (S.PAYLOAD_BUCKET + 2))}
    assert len(bodies) == 2, "control: the encoded size tells a bucket of difference apart"
    sizes = {len(codec.encode_event(publish(world, v, "e")))
             for v in (dict(VALUES, symbol="I"), dict(VALUES, symbol="IBMI"))}
    assert len(sizes) == 1, sizes


# -- tampering --------------------------------------------------------------------------------

def subscriber_key(w: World, credentials: Sequence[Credential]) -> S.SubscriberKey:
    return S.prepare_subscriber_key(w.system, S.keygen_subscriber(w.system, w.msk, EPOCH,
                                                                  credentials))


def with_E(event: EncryptedEvent, i: int, j: int, value: bytes, tags: bool = False
           ) -> EncryptedEvent:
    ct = event.attributes[i]
    items = list(ct.R if tags else ct.E)
    items[j] = value
    new = dataclasses.replace(ct, **{"R" if tags else "E": tuple(items)})
    attributes = tuple(new if k == i else a for k, a in enumerate(event.attributes))
    return dataclasses.replace(event, attributes=attributes)


def flip(data: bytes, k: int) -> bytes:
    out = bytearray(data)
    out[k] ^= 1 << (k % 8)
    return bytes(out)


def test_tampered_matched_E_fails(world):
    """Flipping any byte of E at the subscriber's matched position of any attribute makes
    decrypt raise DecryptionError and verify return False."""
    mine = [enclosing_path(SCHEMA, a.name, VALUES[a.name])[2] for a in SCHEMA.attributes]
    key = subscriber_key(world, mine)
    event = on_wire(world, publish(world, VALUES))
    assert S.verify(world.public, event)  # control: untouched, it verifies and decrypts
    assert S.decrypt(world.system, key, event).values == VALUES
    for i, c in enumerate(mine):
        original = event.attributes[i].E[c.position]
        for k in range(len(original)):
            tampered = on_wire(world, with_E(event, i, c.position, flip(original, k)))
            with pytest.raises(S.DecryptionError):
                S.decrypt(world.system, key, tampered)
            assert not S.verify(world.public, tampered), (i, k)


def batch_holds(pp: S.PublicParams, event: EncryptedEvent, m: Element) -> bool:
    """The verification equation per attribute, e(Sig_i, ĝ) == Y e(F_pub, P2_i) e(m, C1_i),
    for a given m (a digest that ignored P2 would leave m unchanged)."""
    group, h = pp.group, event.header
    for c, s, ct in zip(h.publisher_credentials, event.signatures, event.attributes,
                        strict=True):
        F = pp.F(S.identity_string(c.attribute, S.PUB, h.epoch, c))
        if group.pair(s.Sig, pp.g_hat) != pp.mpk.Y * group.pair(F, s.P2) * group.pair(m, ct.C1):
            return False
    return True


def test_replaced_or_rerandomised_P2_fails_verify(world):
    """Replacing P2_i with another publisher key's P2, or re-randomising (Sig_i F^r,
    P2_i ĝ^r) from public data, fails verify; control: the re-randomised pair satisfies the
    equation under the old m, so only the digest's binding of P2 stops it."""
    pp = world.public
    event = on_wire(world, publish(world, VALUES))
    h = event.header
    m = pp.M(S.signed_digest(codec.encode_header(h), event.C0, event.attributes,
                              event.signatures, event.sealed))
    assert S.verify(pp, event) and batch_holds(pp, event, m)
    for i, (c, sig) in enumerate(zip(h.publisher_credentials, event.signatures, strict=True)):
        other = next(k for k in world.publisher if k.P2 != sig.P2)
        F = pp.F(S.identity_string(c.attribute, S.PUB, h.epoch, c))
        r = pp.group.random_scalar()
        rerandomised = dataclasses.replace(sig, Sig=sig.Sig * F ** r,
                                           P2=sig.P2 * pp.mpk.g_hat ** r)
        for replaced in (dataclasses.replace(sig, P2=other.P2), rerandomised):
            sigs = tuple(replaced if k == i else s for k, s in enumerate(event.signatures))
            tampered = on_wire(world, dataclasses.replace(event, signatures=sigs))
            assert not S.verify(pp, tampered), i
            # control: with m unchanged, the re-randomised pair verifies, the swapped one not
            assert batch_holds(pp, tampered, m) is (replaced.P2 != other.P2)


def test_flipped_padding_fails_verify(world):
    """A flipped byte in a padding E or R of a string attribute fails verify (the digest
    covers every E and R); control: decryption alone does not notice it."""
    pp = world.public
    key = subscriber_key(world, [enclosing_path(SCHEMA, a.name, VALUES[a.name])[-1]
                                 for a in SCHEMA.attributes])
    event = on_wire(world, publish(world, VALUES))
    i = SCHEMA.index("symbol")
    first_pad = len(enclosing_path(SCHEMA, "symbol", VALUES["symbol"]))
    assert first_pad < SCHEMA.attributes[i].positions
    for j in range(first_pad, SCHEMA.attributes[i].positions):
        for tags in (False, True):
            original = (event.attributes[i].R if tags else event.attributes[i].E)[j]
            for k in (0, len(original) // 2, len(original) - 1):
                tampered = on_wire(world, with_E(event, i, j, flip(original, k), tags))
                assert not S.verify(pp, tampered), (j, tags, k)
                assert S.decrypt(world.system, key, tampered).values == VALUES
