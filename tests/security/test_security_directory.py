"""Attacks on the key server's directory against a real key server, each with its control.

Before, any identity could overwrite any (attribute, address) entry: a subscriber
re-registering the root's address made 148 of 153 lookups return no root, 80 dead
addresses from one identity slowed a join from 0.8 s to 53 s, and a root whose policy
constrains ``price`` could list itself as a root of ``price``. Now an address belongs to the
identity whose peer-link certificate names it (``keyserver.ownership``) until the last
certificate naming it expires, whatever happens (no eviction; revocation keeps it blocked),
each identity is refused more than eight live addresses, entries are leases that end with
the certificate, root entries follow the policy, and members other identities saw answering
(vouched) are offered first.

The attack review found that freeing an address early (evicting it over the cap, or on
revocation) let a second identity certify it while the first certificate naming it was
still valid: two valid certificates for one address, so an attacker could certify a root's
future address, free it, and pass as the root once it started there (0 of 4 events
delivered), or collect certificates for a whole host's port range in 40 s.

A later review found that lookups named each entry's identity and served any token any
tree: a publisher limited to ``price <= 1``, in no tree, read which attributes each of four
named subscribers constrains (``bob: price, volume``). Now entries name nobody, a publisher
gets the roots alone, and a subscriber or root looks up only the trees it joins (403
``not_in_tree``), subscribers by the credentials issued to them, not their registrations.
"""

from __future__ import annotations

import base64
import collections
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from keyserver_fixtures import KeyServer, KeyServers, bearer_client

from ibe_pubsub.credentials.peer_certificates import read_peer_certificate
from ibe_pubsub.evaluation.postgres import fresh_database
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError

UNLIMITED = ("--rate", "1e6", "--burst", "1000000", "--address-rate", "1e6",
             "--address-burst", "1000000", "--key-rate", "1e6", "--key-burst", "1000000")
SHORT_EPOCHS = ("--epoch-seconds", "6", "--grace-seconds", "2")
#: The key server's default cap on one identity's live certified addresses.
CAP = 8
_names = itertools.count()
_addresses = itertools.count()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyServers]:
    """This module's own servers, their rate limits out of reach of the floods below; the
    tests share them, each with identities and addresses of its own."""
    servers = KeyServers(tmp_path_factory.mktemp("directory"))
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture(scope="module")
def server(servers: KeyServers) -> KeyServer:
    return servers.start(serve_args=("--workers", "1", *UNLIMITED))


@pytest.fixture(scope="module")
def short_server(servers: KeyServers) -> KeyServer:
    """Epochs of a few seconds, for the tests that wait for certificates to expire."""
    return servers.start(init_args=SHORT_EPOCHS, serve_args=("--workers", "1", *UNLIMITED))


class Peer:
    """An identity's client and name; a subscriber enrolled for ``subscribes`` may look up
    the trees of the attributes it constrains."""

    def __init__(self, server: KeyServer, role: str, policy: str | None = None,
                 subscribes: str | None = None, name: str | None = None) -> None:
        admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
        self.name = name or f"dir-{role}-{next(_names)}"
        self.token = admin.create_identity(self.name, role, policy)["token"]
        self.client = KeyServerClient(server.base_url, self.token, retries=0)
        self.base_url = server.base_url
        if subscribes is not None:
            self.client.enrol_subscriber(subscribes)

    def certify(self, *addresses: str) -> dict[str, Any]:
        key = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
        return self.client.enrol_transport(base64.b64encode(key).decode(), addresses)

    def register(self, address: str, attribute: str, role: str = "subscriber",
                 seen: tuple[str, ...] = ()) -> dict[str, Any]:
        return self.client.register(address, attribute, role, 600, seen)


def _dead_address() -> str:
    """A fresh address nothing listens on (TEST-NET-1, RFC 5737)."""
    n = next(_addresses)
    return f"192.0.2.{n % 254 + 1}:{9000 + n // 254}"


def _refused(call: Callable[[], Any]) -> KeyServerRequestError:
    with pytest.raises(KeyServerRequestError) as info:
        call()
    assert info.value.body["error"]["status"] == info.value.status
    return info.value


def _listed(peer: Peer, attribute: str) -> dict[str, dict[str, Any]]:
    """Every live entry of a tree (roots and members) by address."""
    doc = peer.client.lookup(attribute, sample=100)
    return {e["address"]: e for e in doc["roots"] + doc["members"]}


def test_a_subscriber_cannot_take_over_the_roots_entry(server: KeyServer) -> None:
    root, squatter, rival = Peer(server, "root"), Peer(server, "subscriber"), Peer(server, "root")
    address = _dead_address()
    root.certify(address)
    root.register(address, "symbol", "root")
    squatter.certify(_dead_address())  # both attackers are enrolled peers with addresses
    rival.certify(_dead_address())
    attacks = (lambda: squatter.register(address, "symbol", "subscriber"),
               lambda: squatter.register(address, "symbol", "root"),
               lambda: rival.register(address, "symbol", "root"))
    refusals: collections.Counter[tuple[int, str | None]] = collections.Counter()

    def attack() -> None:
        for i in range(150):
            err = _refused(attacks[i % 3])
            refusals[(err.status, err.code)] += 1

    watcher = Peer(server, "subscriber", subscribes='symbol = "IBM"')
    attacker = threading.Thread(target=attack)
    attacker.start()
    without_root = sum(address not in [r["address"] for r in
                                       watcher.client.lookup("symbol")["roots"]]
                       for _ in range(150))
    attacker.join()
    print(f"150 lookups during 150 takeover attempts: {without_root} without the root; "
          f"refusals {dict(refusals)}")
    assert without_root == 0
    assert refusals == {(403, "address_not_certified"): 100, (403, "wrong_role"): 50}

    # control: the owner's own refresh succeeds
    refreshed = root.register(address, "symbol", "root")
    assert (refreshed["address"], refreshed["role"], refreshed["vouched"]) == (address, "root",
                                                                             True)
    # control: a lookup does show a missing root (here after the owner left)
    root.client.deregister(address)
    assert address not in [r["address"] for r in watcher.client.lookup("symbol")["roots"]]


def test_the_roots_address_is_refused_to_others_until_its_certificate_ends(
        short_server: KeyServer) -> None:
    root, squatter, watcher = (Peer(short_server, r) for r in ("root", "subscriber", "subscriber"))
    address = _dead_address()
    certificate = root.certify(address)
    root.register(address, "price", "root")
    err = _refused(lambda: squatter.certify(address))
    assert (err.status, err.code) == (409, "address_taken")
    assert err.body["error"]["detail"] == {"address": address,
                                           "until": certificate["not_after"]}
    assert squatter.certify(_dead_address())["addresses"]  # control: a free address

    time.sleep(max(0.0, certificate["not_after"] - time.time()) + 0.3)
    # the root's lease (ttl 600 s) ended with its certificate
    watcher.client.enrol_subscriber("price < 10")  # keys of this epoch, to look up price
    assert address not in _listed(watcher, "price")
    assert squatter.certify(address)["addresses"] == [address]  # free again
    err = _refused(lambda: root.register(address, "price", "root"))
    assert (err.status, err.code) == (403, "address_not_certified")


def test_one_identity_with_80_dead_addresses_is_refused_beyond_the_cap(
        server: KeyServer) -> None:
    attacker = Peer(server, "subscriber")
    watcher = Peer(server, "subscriber", subscribes="volume < 10")
    dead = [_dead_address() for _ in range(80)]
    refusals: collections.Counter[tuple[int, str | None]] = collections.Counter()
    issued: list[dict[str, Any]] = []
    for i, address in enumerate(dead):
        try:
            issued.append(attacker.certify(address))
        except KeyServerRequestError as err:
            refusals[(err.status, err.code)] += 1
            # its earliest address frees up first (no certificate of it was renewed)
            assert err.body["error"]["detail"] == {"held": CAP, "cap": CAP,
                                                   "until": issued[0]["not_after"]}
            assert "--listen HOST:PORT" in err.body["error"]["message"]
            err = _refused(lambda address=address: attacker.register(address, "volume"))
            assert (err.status, err.code) == (403, "address_not_certified")
            continue
        attacker.register(address, "volume")
        if i == CAP - 1:  # control: up to the cap, every address is certified and listed
            assert set(_listed(watcher, "volume")) & set(dead) == set(dead[:CAP])
    print(f"80 dead addresses from one identity: refusals {dict(refusals)}")
    assert refusals == {(409, "too_many_addresses"): 80 - CAP}
    assert set(_listed(watcher, "volume")) & set(dead) == set(dead[:CAP])
    # nothing was freed to make room: its first address is still refused to others
    err = _refused(lambda: Peer(server, "subscriber").certify(dead[0]))
    assert (err.status, err.code) == (409, "address_taken")
    # control: re-certifying an address it holds is never refused, even at the cap
    assert attacker.certify(*dead[:4])["addresses"] == dead[:4]

    honest = [Peer(server, "subscriber") for _ in range(3)]
    mine = [_dead_address() for _ in honest]
    for peer, address in zip(honest, mine, strict=True):
        peer.certify(address)
        peer.register(address, "volume")
    for peer, address in zip(honest, mine, strict=True):  # each saw the two others answer
        peer.register(address, "volume", seen=tuple(a for a in mine if a != address))
    members = watcher.client.lookup("volume", sample=100)["members"]
    vouched = [m["vouched"] for m in members]
    assert vouched == sorted(vouched, reverse=True), "vouched members come first"
    assert {m["address"] for m in members if m["vouched"]} == set(mine)
    assert sorted(m["address"] for m in members if m["address"] in dead
                  and not m["vouched"]) == sorted(dead[:CAP])
    for _ in range(10):  # a joiner asking for three gets the vouched honest members
        assert {m["address"] for m in watcher.client.lookup("volume", sample=3)["members"]
                } == set(mine)


def _expire(*certificates: dict[str, Any]) -> None:
    """Sleep until every one of these certificates has expired."""
    time.sleep(max(0.0, max(c["not_after"] for c in certificates) - time.time()) + 0.3)


def test_certifying_beyond_the_cap_frees_no_address(short_server: KeyServer) -> None:
    """The attack review's eviction attack: certify the root's future address, then free it
    by certifying more than the cap, so that another certificate can name it too. Now the
    cap refuses instead of evicting, and the address stays the attacker's (a denial of
    service, never a second certificate) until its certificate expires."""
    mallory, root = Peer(short_server, "subscriber"), Peer(short_server, "root")
    target = _dead_address()
    held = [mallory.certify(target), mallory.certify(*(_dead_address() for _ in range(4))),
            mallory.certify(*(_dead_address() for _ in range(CAP - 5)))]
    # until: when enough of its addresses expire for the request to fit (the 1st earliest
    # for one new address, the 4th for four)
    for more, frees in ((1, held[0]), (4, held[1])):
        err = _refused(lambda more=more: mallory.certify(*(_dead_address()
                                                           for _ in range(more))))
        assert (err.status, err.code) == (409, "too_many_addresses")
        assert err.body["error"]["detail"] == {"held": CAP, "cap": CAP,
                                               "until": frees["not_after"]}
    err = _refused(lambda: root.certify(target))
    assert (err.status, err.code) == (409, "address_taken")
    assert err.body["error"]["detail"] == {"address": target, "until": held[0]["not_after"]}

    # control: once mallory's certificates have expired the address is free again, and
    # mallory may certify new addresses again
    _expire(*held)
    assert root.certify(target)["addresses"] == [target]
    assert mallory.certify(_dead_address())["addresses"]


def test_revocation_keeps_the_address_blocked_until_the_certificate_expires(
        short_server: KeyServer) -> None:
    """The attack review's revocation attack: certify the root's future address and get
    revoked, so that the address is freed while the certificate naming it is valid. Now
    the revoked identity's directory entries go at once, but its address stays refused to
    others until its certificate expires."""
    admin = KeyServerClient(short_server.base_url, short_server.admin_token, retries=0)
    mallory, root = Peer(short_server, "subscriber"), Peer(short_server, "root")
    watcher = Peer(short_server, "subscriber", subscribes='symbol = "IBM"')
    target = _dead_address()
    certificate = mallory.certify(target)
    mallory.register(target, "symbol")
    assert target in _listed(watcher, "symbol")  # control: listed before the revocation
    admin.revoke(next(i["id"] for i in admin.list_identities() if i["name"] == mallory.name))

    assert target not in _listed(watcher, "symbol")  # its entries are gone at once
    err = _refused(lambda: mallory.register(target, "symbol"))
    assert (err.status, err.code) == (403, "revoked")
    err = _refused(lambda: mallory.certify(target))
    assert (err.status, err.code) == (403, "revoked")
    err = _refused(lambda: root.certify(target))
    assert (err.status, err.code) == (409, "address_taken")
    assert err.body["error"]["detail"] == {"address": target,
                                           "until": certificate["not_after"]}
    assert root.certify(_dead_address())["addresses"]  # control: a free address

    _expire(certificate)  # control: free once the revoked identity's certificate expired
    assert root.certify(target)["addresses"] == [target]
    assert root.register(target, "symbol", "root")["address"] == target


#: The attack review's subscribers: subscription, and the trees it joins (those whose
#: attributes it constrains).
SUBSCRIBERS = {"alice": ("price < 100", ("price",)),
               "bob": ("price < 50 and volume > 1000", ("price", "volume")),
               "carol": ("volume < 10", ("volume",)),
               "dave": ('symbol = "IBM"', ("symbol",))}
#: Every field of a lookup's entry: no identity name.
ENTRY_FIELDS = {"address", "role", "expires_at", "vouched"}


class Population(NamedTuple):
    root: str
    names: dict[str, str]
    peers: dict[str, Peer]
    addresses: dict[str, str]


@pytest.fixture(scope="module")
def population(server: KeyServer) -> Population:
    """A root of every tree, and the four named subscribers registered, as their peers do,
    in the trees they join."""
    root, root_address = Peer(server, "root"), _dead_address()
    root.certify(root_address)
    run = next(_names)
    peers, addresses = {}, {}
    for who, (subscription, trees) in SUBSCRIBERS.items():
        peer = peers[who] = Peer(server, "subscriber", subscribes=subscription,
                                 name=f"{who}-{run}")
        address = addresses[who] = _dead_address()
        peer.certify(address)
        for tree in trees:
            peer.register(address, tree)
    for tree in ("symbol", "price", "volume"):
        root.register(root_address, tree, "root")
    return Population(root_address, {w: p.name for w, p in peers.items()}, peers, addresses)


def _lookup_text(server: KeyServer, token: str, attribute: str) -> tuple[int, str]:
    """Status and raw body of a lookup of the whole tree: every byte a caller gets."""
    with bearer_client(server.base_url, token) as http:
        answer = http.get(f"/v1/directory/{attribute}", params={"sample": 100})
    return answer.status_code, answer.text


def _check_nameless(doc: dict[str, Any], text: str, names: dict[str, str]) -> None:
    assert set(doc) == {"attribute", "roots", "members"}
    assert all(set(e) == ENTRY_FIELDS for e in doc["roots"] + doc["members"])
    assert not [n for n in names.values() if n in text]


def test_a_publisher_learns_the_roots_and_nothing_of_the_subscribers(
        server: KeyServer, population: Population) -> None:
    """The attack review's scenario: a publisher limited to ``price <= 1``, in no tree, read
    for each named subscriber which attributes it constrains (``bob: price, volume``). Now
    a publisher gets each tree's roots (all it sends to) and no members, no names."""
    publisher = Peer(server, "publisher", "price <= 1")
    publisher.client.enrol_publisher("price <= 1")
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    learned = {}
    for tree in ("symbol", "price", "volume"):
        status, text = _lookup_text(server, publisher.token, tree)
        assert status == 200, text
        doc = json.loads(text)
        _check_nameless(doc, text, population.names)
        assert doc["members"] == []
        assert population.root in [r["address"] for r in doc["roots"]]
        assert {r["role"] for r in doc["roots"]} == {"root"}
        learned[tree] = {a for a in (e["address"] for e in doc["roots"] + doc["members"])
                         if a in population.addresses.values()}
        # control: the members are there to be leaked (the admin sees them)
        members = {m["address"] for m in admin.lookup(tree, sample=100)["members"]}
        joined = {population.addresses[w] for w, (_, trees) in SUBSCRIBERS.items()
                  if tree in trees}
        assert members >= joined
    print(f"what a publisher learns of the subscribers' trees: {learned}")
    assert learned == {"symbol": set(), "price": set(), "volume": set()}


def test_a_subscriber_looks_up_only_the_trees_it_joins_and_learns_no_names(
        server: KeyServer, population: Population) -> None:
    """A subscriber gets the members of the trees it joins, without names,
    and 403 ``not_in_tree`` for the others, so it cannot tell which subscribers constrain
    an attribute it does not; registering in a tree first earns no lookup of it."""
    alice, bob = population.peers["alice"], population.peers["bob"]
    for tree in ("volume", "symbol"):
        err = _refused(lambda tree=tree: alice.client.lookup(tree))
        assert (err.status, err.code) == (403, "not_in_tree")
        assert set(err.body) == {"error"} and set(err.body["error"]) == {"status", "code",
                                                                          "message"}
    # control: its own tree, with the members that joined it, and no name
    status, text = _lookup_text(server, alice.token, "price")
    assert status == 200, text
    doc = json.loads(text)
    _check_nameless(doc, text, population.names)
    assert {m["address"] for m in doc["members"]} >= {population.addresses["alice"],
                                                     population.addresses["bob"]}
    assert population.addresses["carol"] not in {m["address"] for m in doc["members"]}
    assert population.addresses["carol"] in _listed(bob, "volume")  # bob's other tree

    mallory, address = Peer(server, "subscriber", subscribes="price < 10"), _dead_address()
    mallory.certify(address)
    mallory.register(address, "symbol")  # a lease in a tree it holds no credential of
    err = _refused(lambda: mallory.client.lookup("symbol"))
    assert (err.status, err.code) == (403, "not_in_tree")


def test_a_bulk_issued_subscriber_looks_up_the_trees_of_its_bundle(server: KeyServer) -> None:
    """Bulk issuance grants the trees of the credentials it issues, as enrolment does."""
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    name = f"dir-bulk-{next(_names)}"
    bundle = admin.bulk(f"chunk-{name}", [{"identity": name, "role": "subscriber",
                                           "credentials": [{"attribute": "volume",
                                                            "credential": "volume:0",
                                                            "fine": False, "position": 1}]}]
                        )["bundles"][0]
    client = KeyServerClient(server.base_url, bundle["token"], retries=0)
    assert set(client.lookup("volume")) == {"attribute", "roots", "members"}
    err = _refused(lambda: client.lookup("price"))
    assert (err.status, err.code) == (403, "not_in_tree")


def test_a_root_is_listed_only_for_trees_its_policy_leaves_whole(server: KeyServer) -> None:
    root = Peer(server, "root", "price < 10")
    watcher = Peer(server, "subscriber", subscribes="price < 10 and volume < 10")
    address = _dead_address()
    issued = root.certify(address)
    binding = read_peer_certificate(
        x509.load_pem_x509_certificate(issued["certificate"].encode())).binding
    assert "price" not in binding.attributes and "volume" in binding.attributes
    err = _refused(lambda: root.register(address, "price", "root"))
    assert (err.status, err.code) == (403, "outside_policy")
    assert address not in _listed(watcher, "price")
    # control: the same root, a tree its policy leaves whole
    assert root.register(address, "volume", "root")["role"] == "root"
    assert _listed(watcher, "volume")[address]["role"] == "root"
    # and it looks up only the trees it may serve
    err = _refused(lambda: root.client.lookup("price"))
    assert (err.status, err.code) == (403, "not_in_tree")
    assert address in _listed(root, "volume")


def test_only_the_owner_removes_its_address(server: KeyServer) -> None:
    owner = Peer(server, "subscriber")
    other = Peer(server, "subscriber", subscribes="price < 10 and volume < 10")
    address = _dead_address()
    owner.certify(address)
    for tree in ("volume", "price"):
        owner.register(address, tree)
    err = _refused(lambda: other.client.deregister(address))
    assert (err.status, err.code) == (403, "not_owner")
    assert all(address in _listed(other, tree) for tree in ("volume", "price"))

    with bearer_client(server.base_url, owner.token) as http:
        path = f"/v1/directory/{address}"
        assert http.delete(path).status_code == 204
        assert not any(address in _listed(other, tree) for tree in ("volume", "price"))
        assert http.delete(path).status_code == 204  # nothing left to remove
        assert http.delete(f"/v1/directory/{_dead_address()}").status_code == 204  # nobody's
        assert http.delete("/v1/directory/LOCALHOST:1").status_code == 422
    # without a token the gate refuses it, counted under the route's own template
    public = KeyServerClient(server.base_url, retries=0)
    assert _refused(lambda: public.deregister(address)).status == 401
    assert ('ibe_keyserver_requests_total{method="DELETE",route="/v1/directory/{address}",'
            'status="401"} 1') in public.metrics()


def test_vouches_count_only_from_other_identities(server: KeyServer) -> None:
    a, b, c = (Peer(server, "subscriber", subscribes="price < 10") for _ in range(3))
    aa, bb, cc, cc2 = (_dead_address() for _ in range(4))
    for peer, addresses in ((a, (aa,)), (b, (bb,)), (c, (cc, cc2))):
        peer.certify(*addresses)
        for address in addresses:
            peer.register(address, "price")
    mine = (aa, bb, cc, cc2)
    assert not any(_listed(a, "price")[x]["vouched"] for x in mine)

    a.register(aa, "price", seen=(bb,))       # A saw B answer
    b.register(bb, "price", seen=(bb,))       # B vouches for itself
    c.register(cc, "price", seen=(cc, cc2))   # C for itself, at its other address too
    listed = _listed(a, "price")
    assert {x: listed[x]["vouched"] for x in mine} == {aa: False, bb: True, cc: False,
                                                       cc2: False}
    for _ in range(10):  # the one vouched member comes first
        assert [m["address"] for m in a.client.lookup("price", sample=1)["members"]] == [bb]
    err = _refused(lambda: a.register(aa, "price", seen=("LOCALHOST:1",)))
    assert (err.status, err.code) == (422, "non_canonical_address")
    assert _refused(lambda: a.register(aa, "price", seen=(bb,) * 33)).status == 422


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def racing_server(request: pytest.FixtureRequest, servers: KeyServers) -> KeyServer:
    if request.param == "sqlite":
        return request.getfixturevalue("short_server")
    url = fresh_database(request.getfixturevalue("postgres_url"))
    return servers.start(init_args=("--database-url", url, *SHORT_EPOCHS),
                         serve_args=("--database-url", url, "--workers", "1", *UNLIMITED))


def test_concurrent_claims_of_one_address_have_one_winner(racing_server: KeyServer) -> None:
    """Eight identities certify the same free address at once: one gets it, the others 409
    (never a 500, never two owners); again once the winner's certificate has expired,
    which takes over an existing row instead of inserting one."""
    peers = [Peer(racing_server, "subscriber") for _ in range(8)]
    address = _dead_address()

    def race() -> list[Peer]:
        def claim(peer: Peer) -> Peer | None:
            try:
                peer.certify(address)
            except KeyServerRequestError as exc:
                assert (exc.status, exc.code) == (409, "address_taken"), exc.body
                return None
            return peer

        with ThreadPoolExecutor(len(peers)) as pool:
            return [p for p in pool.map(claim, peers) if p is not None]

    for round_ in range(2):
        winners = race()
        assert len(winners) == 1, f"round {round_}: {len(winners)} owners"
        winner = winners[0]
        until = winner.register(address, "symbol")["expires_at"]  # control: the winner owns it
        loser = next(p for p in peers if p is not winner)
        assert _refused(lambda loser=loser: loser.register(address, "symbol")).status == 403
        time.sleep(max(0.0, until - time.time()) + 0.3)


def test_concurrent_claims_of_one_identity_stay_within_its_cap(
        racing_server: KeyServer) -> None:
    """One identity certifies twice its cap of fresh addresses at once: exactly the cap
    succeed, the others are 409 ``too_many_addresses`` (never a 500, never more)."""
    peer = Peer(racing_server, "subscriber")
    epoch = KeyServerClient(racing_server.base_url).epoch()
    if epoch["epoch_end"] - time.time() < 3:  # no certificate may expire during the race
        time.sleep(max(0.0, epoch["epoch_end"] - time.time()) + 0.2)

    def claim(address: str) -> str | None:
        try:
            peer.certify(address)
        except KeyServerRequestError as exc:
            assert (exc.status, exc.code) == (409, "too_many_addresses"), exc.body
            return None
        return address

    with ThreadPoolExecutor(2 * CAP) as pool:
        won = [a for a in pool.map(claim, [_dead_address() for _ in range(2 * CAP)]) if a]
    assert len(won) == CAP, won
    for address in won:  # control: each one it won is its own
        peer.register(address, "symbol")


def test_concurrent_enrolments_of_one_subscriber_grant_all_its_trees(
        racing_server: KeyServer) -> None:
    """Eight enrolments of one subscriber at once, each joining other trees: all succeed
    (the grants are upserts, never a 500 on a duplicate key) and every tree is granted."""
    peer = Peer(racing_server, "subscriber")
    epoch = KeyServerClient(racing_server.base_url).epoch()
    if epoch["epoch_end"] - time.time() < 4:  # the grants must not expire before the check
        time.sleep(max(0.0, epoch["epoch_end"] - time.time()) + 0.2)
    subscriptions = ["price < 10", "volume < 10", 'symbol = "IBM"',
                     "price < 10 and volume < 10"] * 2
    with ThreadPoolExecutor(len(subscriptions)) as pool:
        list(pool.map(peer.client.enrol_subscriber, subscriptions))
    for tree in ("symbol", "price", "volume"):
        assert peer.client.lookup(tree)["attribute"] == tree


def test_the_cap_is_configurable(keyserver_factory: KeyServers,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-peer-addresses``, here through its environment variable (the TOML file and
    the flag work the same way, ``peer.config``)."""
    monkeypatch.setenv("IBE_PUBSUB_MAX_PEER_ADDRESSES", "2")
    server = keyserver_factory.start(serve_args=("--workers", "1"))
    peer = Peer(server, "subscriber")
    watcher = Peer(server, "subscriber", subscribes='symbol = "IBM"')
    addresses = [_dead_address() for _ in range(3)]
    err = _refused(lambda: peer.certify(*addresses))
    assert (err.status, err.code) == (422, "too_many_addresses")
    first = peer.certify(addresses[0])
    peer.certify(addresses[1])
    for address in addresses[:2]:
        peer.register(address, "symbol")
    err = _refused(lambda: peer.certify(addresses[2]))
    assert (err.status, err.code) == (409, "too_many_addresses")
    assert err.body["error"]["detail"] == {"held": 2, "cap": 2, "until": first["not_after"]}
    assert set(_listed(watcher, "symbol")) == set(addresses[:2])
    assert peer.certify(*addresses[:2])["addresses"] == addresses[:2]  # control: renewal
