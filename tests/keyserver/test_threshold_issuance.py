"""Issuance by a threshold deployment (3 of 5): five real `keyserver serve` processes, each
with its own data directory, database, administrator and identities, serve their shares;
clients check, combine and fall back (keyserver.threshold_client).

The set-up runs in this process (its own tests are in test_threshold_setup.py) and each
member's outcome is written to its data directory exactly as `keyserver threshold-setup`
writes it. Then only HTTP: tokens from each member's admin API, shares from /v3."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from peer_links import FAST, Inbox
from repository import REPO_ROOT
from threshold_members import GROUP, PASSPHRASE, n, t, threshold_identity

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.certificates import root_certificate_message, schema_message
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.peer_certificates import PeerBinding
from ibe_pubsub.credentials.schema import Schema, default_schema
from ibe_pubsub.credentials.server_keys import Ed25519Server
from ibe_pubsub.credentials.shamir import lagrange_at_zero
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    serve_expecting_exit,
)
from ibe_pubsub.evaluation.threshold_lab import write_local_setup
from ibe_pubsub.keyserver import (
    MAX_ANSWER_BYTES,
    MEMBER_KEY_FILE,
    KeyServerError,
    ThresholdEnrolmentError,
    ThresholdKeyClient,
    load_shares,
    max_answer_bytes,
    read_access_file,
)
from ibe_pubsub.peer.tls import PeerTLS
from ibe_pubsub.peer.transport import Transport

EVENT = S.Event("quote-1", {"symbol": "IBM", "price": 131.5, "volume": 2000}, b"hello")


def run(coroutine):
    return asyncio.run(coroutine)


async def enrol_subscriber(client, subscription):
    async with client:
        return await client.enrol_subscriber(subscription)


async def enrol_root(client, attribute, transport_key):
    async with client:
        return await client.enrol_root(attribute, transport_key)


async def enrol_publisher(client, advertisement=""):
    async with client:
        return await client.enrol_publisher(advertisement)


def reads(pp, key, ciphertext):
    try:
        return S.decrypt(pp, S.prepare_subscriber_key(pp, key), ciphertext) == EVENT
    except S.SchemeError:
        return False


@pytest.fixture(scope="module")
def published(deployment):
    """An event encrypted and signed with publisher keys combined from members 2, 4, 5."""
    tokens = deployment.register("ticker", "publisher")
    combined = run(enrol_publisher(deployment.client(tokens, order=(2, 4, 5, 1, 3))))
    assert combined.members == (2, 4, 5) and not combined.failures
    ciphertext = S.encrypt_and_sign(deployment.pp, list(combined.keys), EVENT)
    assert S.verify(deployment.pp, ciphertext)
    return ciphertext


def test_members_serve_one_outcome_and_no_version_2_keys(deployment, keyserver):
    documents = [httpx.get(deployment.url(i) + "/v3/threshold").json()
                 for i in range(1, n + 1)]
    assert [d["index"] for d in documents] == [1, 2, 3, 4, 5]
    assert len({(d["public_key"], d["fingerprint"], d["t"], d["n"]) for d in documents}) == 1
    assert T.decode_public_key(GROUP, base64.b64decode(documents[0]["public_key"])) \
        == deployment.tpk
    token = deployment.register("mallory", "subscriber", at=[1])[1]["token"]
    headers = {"Authorization": f"Bearer {token}"}
    link_key = base64.b64encode(bytes(32)).decode()
    for path, body in (("/v1/enrol/subscriber", {"subscription": ""}),
                       ("/v1/enrol/publisher", {"advertisement": ""}),
                       ("/v1/enrol/transport", {"public_key": link_key, "addresses": []})):
        answer = httpx.post(deployment.url(1) + path, json=body, headers=headers)
        assert answer.status_code == 409 and answer.json()["error"]["code"] == \
            "threshold_member", answer.text
    item = {"identity": "bulk-1", "role": "publisher",
            "credentials": [{"attribute": "symbol", "credential": "*", "position": 0}]}
    bulk = httpx.post(deployment.url(1) + "/v1/admin/bulk",
                      json={"chunk_id": "c1", "items": [item]},
                      headers={"Authorization": f"Bearer {deployment.admin[1]}"})
    assert bulk.status_code == 409 and "member 1 of" in bulk.json()["error"]["message"]
    # An epoch is asked for by number: the current one, or the next in its grace window.
    current = httpx.get(deployment.url(1) + "/v1/epoch").json()
    assert current["epoch"] == int(current["epoch_start"]) // current["epoch_length"]
    for wanted, status in ((current["epoch"], 200), (current["epoch"] + 2, 409)):
        answer = httpx.post(deployment.url(1) + "/v3/enrol/subscriber", headers=headers,
                            json={"subscription": 'symbol = "IBM"', "epoch": wanted})
        assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == "epoch_unavailable"
    # A single key server has no /v3: 404 with a JSON body that says so (the control).
    answer = httpx.get(keyserver.base_url + "/v3/threshold")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_threshold"


def test_the_schema_is_the_one_t_members_signed(deployment, keyserver):
    """Each member serves its schema with a partial signature that verifies against its
    ``ĝ^x_i``; any 3 combine into the one signature that verifies against ``X`` (2 do not).
    The client takes the schema 3 members signed: a member 4 that answers another schema,
    under its true signature or under its own real signature of the other schema, is
    skipped; with members 4 and 5 doing so and member 3 down, no schema is taken."""
    answers = [httpx.get(deployment.url(i) + "/v3/schema").json() for i in range(1, n + 1)]
    assert [a["index"] for a in answers] == [1, 2, 3, 4, 5]
    schema = Schema.from_dict(answers[0]["schema"])
    assert schema == default_schema() and answers[0]["schema_id"] == schema.id
    message = schema_message(schema)
    partials = [T.decode_partial_signature(GROUP, base64.b64decode(a["signature"]))
                for a in answers]
    assert all(T.verify_partial_signature(GROUP, deployment.tpk, message, p) for p in partials)
    first, last = (T.combine_signatures(GROUP, deployment.tpk, ps)
                   for ps in (partials[:3], partials[2:]))
    assert first == last and T.verify_signature(GROUP, deployment.tpk.X, message, first)
    two = lagrange_at_zero([1, 2], GROUP.order)  # as if 2 were enough
    assert not T.verify_signature(GROUP, deployment.tpk.X, message, GROUP.multi_exp(
        [p.sigma for p in partials[:2]], [two[1], two[2]]))

    other = Schema.from_dict(schema.to_dict() | {"name": "another"})
    secrets = {i: load_shares(deployment.dirs[i - 1], PASSPHRASE) for i in (4, 5)}

    def other_schema(signed_by=None):
        def behave(handler, _body):
            document = handler.forward(None) | {"schema": other.to_dict(),
                                                "schema_id": other.id}
            if signed_by is not None:
                partial = T.partial_sign(GROUP, secrets[signed_by], schema_message(other))
                document["signature"] = base64.b64encode(
                    T.encode_partial_signature(partial)).decode()
            handler.reply(json.dumps(document).encode())
        return behave

    async def signed(urls, order=(4, 1, 2, 3, 5)):
        async with ThresholdKeyClient(deployment.tpk, deployment.access({}, order, urls),
                                      spread=False, timeout=5) as client:
            return await client.signed_schema()

    for behave, reason in ((other_schema(), "does not verify"),
                           (other_schema(signed_by=4), "agrees with fewer than 3")):
        with hostile_member(deployment.url(4), behave) as url:
            got = run(signed({4: url}))
            assert got.schema == schema and got.members == (1, 2, 3)
            assert got.signature == first
            assert [f.index for f in got.failures] == [4] and reason in got.failures[0].reason
    # The control: two members signing the other schema are not enough for it.
    with hostile_member(deployment.url(4), other_schema(signed_by=4)) as four, \
            hostile_member(deployment.url(5), other_schema(signed_by=5)) as five, \
            pytest.raises(ThresholdEnrolmentError, match="member 3: unreachable"):
        run(signed({4: four, 5: five, 3: "http://127.0.0.1:9"}))
    single = httpx.get(keyserver.base_url + "/v3/schema")
    assert single.status_code == 404 and single.json()["error"]["code"] == "not_threshold"


def test_a_member_with_another_set_ups_public_key_refuses_to_start(deployment, tmp_path):
    """The operator copied the wrong threshold.json: serving would answer bad shares."""
    others = [tmp_path / f"other-{i}" for i in range(1, n + 1)]
    for d in others:
        d.mkdir(mode=0o700)
    write_local_setup(GROUP, others, [deployment.url(i) for i in range(1, n + 1)],
                      PASSPHRASE, "acme", t)
    copy = tmp_path / "member-1-copy"
    shutil.copytree(deployment.dirs[0], copy, ignore=shutil.ignore_patterns("server.log"))
    shutil.copy(others[0] / "threshold.json", copy / "threshold.json")
    refused = serve_expecting_exit(copy, PASSPHRASE, timeout=60)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "not server 1's" in refused.stderr and "bad shares" in refused.stderr
    # The right set-up, but a member initialised with another epoch length than the
    # deployment's: it would number epochs apart from the others.
    shutil.copy(deployment.dirs[0] / "threshold.json", copy / "threshold.json")
    document = json.loads((copy / "threshold.json").read_text())
    (copy / "threshold.json").write_text(json.dumps(document | {"epoch_seconds": 600,
                                                                "grace_seconds": 150}))
    refused = serve_expecting_exit(copy, PASSPHRASE, timeout=60)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "initialised with 3600 s epochs and a 300 s grace" in refused.stderr
    assert "has 600 s and 150 s" in refused.stderr
    # The right set-up and shares, but another member's key (it signs link certificates
    # as member 1): refused too.
    shutil.copy(deployment.dirs[0] / "threshold.json", copy / "threshold.json")
    shutil.copy(deployment.dirs[1] / MEMBER_KEY_FILE, copy / MEMBER_KEY_FILE)
    refused = serve_expecting_exit(copy, PASSPHRASE, timeout=60)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "is not member 1's" in refused.stderr


def test_keys_combined_from_different_member_sets_read_exactly_what_they_match(
        deployment, published):
    pp = deployment.pp
    alice = deployment.register("alice", "subscriber")
    first = run(enrol_subscriber(deployment.client(alice, order=(1, 2, 3, 4, 5)),
                                 'symbol = "IBM"'))
    second = run(enrol_subscriber(deployment.client(alice, order=(5, 4, 3, 2, 1)),
                                  'symbol = "IBM"'))
    assert first.members == (1, 2, 3) and second.members == (3, 4, 5)
    assert first.key.D != second.key.D  # two sets, two bindings; both work
    assert reads(pp, first.key, published) and reads(pp, second.key, published)
    assert first.expires_at == second.expires_at > published.header.epoch
    bob = deployment.register("bob", "subscriber")
    other = run(enrol_subscriber(deployment.client(bob), 'symbol = "MSFT"'))
    assert not reads(pp, other.key, published)


def documented_program(marker: str, path: Path) -> None:
    """docs/operations.md's program after ``<!-- marker -->``, verbatim, written to
    ``path``."""
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    path.write_text(text.split(f"<!-- {marker} -->\n```python\n", 1)[1].split("```", 1)[0])


def test_the_documented_client_program_enrols(deployment, tmp_path):
    """docs/operations.md's program, verbatim, as a user runs it."""
    documented_program("threshold-example", tmp_path / "enrol.py")
    added = threshold_identity(deployment, "add", "zoe", [1, 3, 4, 5], "--role", "subscriber",
                               "--access-file", str(tmp_path / "zoe.json"))
    assert added.returncode == 0, added.stderr
    done = subprocess.run([sys.executable, "enrol.py", str(deployment.dirs[0] / "threshold.json"),
                           "zoe.json", 'symbol = "IBM" and price < 200'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    match = re.fullmatch(r"epoch (\d+): keys for (\d+) credentials, combined from members "
                         r"\[(\d), (\d), (\d)\]\n", done.stdout)
    assert match and int(match[2]) >= 2 and "2" not in match.groups()[2:], done.stdout


def test_the_documented_root_program_enrols(deployment, tmp_path):
    """docs/operations.md's root program, verbatim: a root identity added at every member
    with one command gets a certificate that t members signed; run again, it keeps its
    transport key (mode 0600) and gets the same epoch's certificate."""
    documented_program("threshold-root-example", tmp_path / "root.py")
    added = threshold_identity(deployment, "add", "root-doc", range(1, n + 1), "--role",
                               "root", "--access-file", str(tmp_path / "root-doc.json"))
    assert added.returncode == 0, added.stderr
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "root.py",
                               str(deployment.dirs[0] / "threshold.json"), "root-doc.json",
                               "price", "transport.key"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(r"root of 'price' in epoch \d+ until \d+, signed by members "
                            r"\[\d, \d, \d\]\n", done.stdout), done.stdout
        outputs.append(done.stdout.split(", signed")[0])
    assert outputs[0] == outputs[1]
    assert (tmp_path / "transport.key").stat().st_mode & 0o777 == 0o600


async def certify(client, key, addresses):
    async with client:
        return await client.certify_link_key(key.public_key().public_bytes_raw(), addresses)


def test_link_certificates_signed_by_a_quorum_of_members_carry_mutual_tls(deployment):
    """A subscriber's and a root's link keys, each certified by a quorum of 4 of the 5
    members (not t = 3: see the next test), make a TLS link between two transports on the
    certified addresses; the binding is what the members know of the identity."""
    lina, rooty = deployment.register("lina", "subscriber"), deployment.register("rooty", "root")
    keys = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    addresses = [f"127.0.0.1:{free_port()}" for _ in keys]
    a = run(certify(deployment.client(lina), keys[0], [addresses[0]]))
    b = run(certify(deployment.client(rooty, order=(2, 3, 4, 5)), keys[1], [addresses[1]]))
    epoch = httpx.get(deployment.url(1) + "/v1/epoch").json()["epoch"]
    assert (a.members, b.members) == ((1, 2, 3, 4), (2, 3, 4, 5))
    assert a.binding == PeerBinding("lina", "subscriber", (addresses[0],), (), epoch)
    assert b.binding.role == "root" and set(b.binding.attributes) == set(
        deployment.pp.schema.names)
    # A client that may ask only t members cannot make up the quorum, and says so.
    with pytest.raises(KeyServerError, match="needs the signatures of 4 of the 5 members"):
        run(certify(deployment.client(lina, order=(1, 2, 3)), keys[0], [addresses[0]]))
    client = deployment.client(lina)

    async def link():
        inboxes = Inbox(), Inbox()
        peers = [Transport(inbox, backoff=FAST) for inbox in inboxes]
        links = await client.link_verifier()  # the member keys, as t members signed them
        assert links.quorum == 4 and sorted(links.member_keys) == [1, 2, 3, 4, 5]
        for peer, key, address, combined in zip(peers, keys, addresses, (a, b), strict=True):
            await peer.listen("127.0.0.1", int(address.rsplit(":", 1)[1]))
            peer.tls = PeerTLS(key, combined.certificate, client.handshake_ca, links=links)
        peers[0].send(addresses[1], b"to the root")
        assert await inboxes[1].wait_for(1) == [(addresses[0], b"to the root")]
        assert peers[1].peer_certificate(addresses[0]).binding == a.binding
        assert not (peers[0].refused or peers[1].refused)
        for peer in peers:
            await peer.close()
        await client.aclose()
    run(link())


DOWN = "http://127.0.0.1:1"


def test_an_address_is_certified_to_one_identity_even_across_member_outages(deployment):
    """Members claim an address for the identity they certify it to, each in its own
    database; a certificate needs a quorum of 4, so any two certificates share 3 members, and
    another identity cannot collect a quorum where the owner's claim is missing (member 5,
    down when the owner certified, signs for eve, alone). With members 4 and 5 down the
    owner gets no certificate either: that is the quorum's price."""
    owner, eve = deployment.register("owner", "subscriber"), deployment.register("eve",
                                                                                 "subscriber")
    address = [f"127.0.0.1:{free_port()}"]
    with pytest.raises(ThresholdEnrolmentError, match="no 4 members"):
        run(certify(deployment.client(owner, urls={4: DOWN, 5: DOWN}),
                    Ed25519PrivateKey.generate(), address))
    run(certify(deployment.client(owner, urls={5: DOWN}), Ed25519PrivateKey.generate(),
                address))
    with pytest.raises(ThresholdEnrolmentError) as refused:
        run(certify(deployment.client(eve), Ed25519PrivateKey.generate(), address))
    assert sorted(f.index for f in refused.value.failures) == [1, 2, 3, 4]  # 5 signed
    assert all("409" in f.reason and "certified to another identity" in f.reason
               for f in refused.value.failures)


def test_a_bad_link_signature_is_routed_around_and_a_slow_member_not_waited_for(deployment):
    owner = deployment.register("owner-2", "subscriber")
    address = [f"127.0.0.1:{free_port()}"]

    def later(handler, body):  # signs what the client would read as a longer life
        document = handler.forward(body)
        handler.reply(json.dumps(document | {"not_after": document["not_after"] + 86400})
                      .encode())

    def slow(handler, body):
        time.sleep(4)
        handler.reply(json.dumps(handler.forward(body)).encode())

    with hostile_member(deployment.url(2), later) as bad:
        combined = run(certify(deployment.client(owner, urls={2: bad}),
                               Ed25519PrivateKey.generate(), address))
    assert combined.members == (1, 3, 4, 5)
    assert [(f.index, "does not verify" in f.reason) for f in combined.failures] == [(2, True)]
    with hostile_member(deployment.url(5), slow) as late:
        started = time.monotonic()
        combined = run(certify(deployment.client(owner, urls={5: late}, hedge=0.5),
                               Ed25519PrivateKey.generate(), address))
        took = time.monotonic() - started
    assert combined.members == (1, 2, 3, 4) and took < 3.5, took
    assert [(f.index, "had not answered" in f.reason) for f in combined.failures] == [
        (5, True)]


def test_the_documented_link_program_links_two_peers(deployment, tmp_path):
    """docs/operations.md's link program, verbatim: two link keys of one identity added at
    every member, each certified by a quorum, make a mutual-TLS link on which each side
    sees the other's binding."""
    documented_program("threshold-link-example", tmp_path / "link.py")
    added = threshold_identity(deployment, "add", "link-doc", range(1, n + 1), "--role",
                               "subscriber", "--access-file", str(tmp_path / "link-doc.json"))
    assert added.returncode == 0, added.stderr
    done = subprocess.run([sys.executable, "link.py", str(deployment.dirs[0] / "threshold.json"),
                           "link-doc.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    certified = [re.fullmatch(r"(127\.0\.0\.1:\d+): signed by members \[(\d), (\d), (\d), "
                              r"(\d)\]", line) for line in lines[:2]]
    assert all(certified) and len(lines) == 3, done.stdout
    listener, dialer = (match[1] for match in certified)
    assert lines[2] == (f"linked: the dialer sees link-doc at ['{listener}'], the listener "
                        f"sees link-doc at ['{dialer}']"), done.stdout


def raw_shares(deployment, tokens, members, subscription):
    shares = []
    for i in members:
        answer = httpx.post(deployment.url(i) + "/v3/enrol/subscriber",
                            json={"subscription": subscription},
                            headers={"Authorization": f"Bearer {tokens[i]['token']}"})
        assert answer.status_code == 200, answer.text
        shares.append(T.decode_subscriber_share(GROUP, base64.b64decode(answer.json()["share"])))
    return shares


def interpolate(shares):
    """Combine shares as if they were enough, with their own Lagrange weights."""
    weights = lagrange_at_zero([s.index for s in shares], GROUP.order)
    w = [weights[s.index] for s in shares]
    first = shares[0].key
    return S.SubscriberKey(first.epoch, GROUP.multi_exp([s.key.D for s in shares], w), tuple(
        replace(k, S1=GROUP.multi_exp([s.key.credentials[m].S1 for s in shares], w),
                S2=GROUP.multi_exp([s.key.credentials[m].S2 for s in shares], w),
                T=GROUP.multi_exp([s.key.credentials[m].T for s in shares], w))
        for m, k in enumerate(first.credentials)))


def test_the_shares_of_any_two_members_do_not_decrypt(deployment, published):
    carol = deployment.register("carol", "subscriber")
    shares = raw_shares(deployment, carol, range(1, n + 1), 'symbol = "IBM"')
    assert reads(deployment.pp, interpolate(shares[:3]), published)  # control: three do
    for pair in ((0, 1), (1, 4), (2, 3)):
        assert not reads(deployment.pp, interpolate([shares[k] for k in pair]), published)


class Hostile(BaseHTTPRequestHandler):
    """A hostile member in front of the real one (``target``): ``behave(handler, body)``
    answers each request."""

    target = ""

    def do_POST(self):
        self.behave(self.rfile.read(int(self.headers["Content-Length"])))

    def do_GET(self):
        self.behave(None)

    def forward(self, body):
        if body is None:
            token = self.headers["Authorization"]
            return httpx.get(self.target + self.path,
                             headers={"Authorization": token} if token else {}).json()
        return httpx.post(self.target + self.path, content=body, headers={
            "Authorization": self.headers["Authorization"],
            "content-type": "application/json"}).json()

    def reply(self, data, length=None):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(length or len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):
        pass


@contextlib.contextmanager
def hostile_member(target, behave):
    handler = type("Handler", (Hostile,), {"target": target, "behave": behave})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def with_share(handler, body, change, **fields):
    """The real member's answer with its share replaced by ``change(share)`` (and
    ``fields`` replaced)."""
    document = handler.forward(body)
    share = change(T.decode_subscriber_share(GROUP, base64.b64decode(document["share"])))
    document |= {"share": base64.b64encode(T.encode_subscriber_share(share)).decode(),
                 "epoch": share.key.epoch} | fields
    handler.reply(json.dumps(document).encode())


def tamper(handler, body):
    with_share(handler, body, lambda share: replace(
        share, key=replace(share.key, D=share.key.D * GROUP.generator(S.G1))))


def test_a_bad_share_is_detected_named_and_routed_around(deployment, published):
    dave = deployment.register("dave", "subscriber")
    with hostile_member(deployment.url(4), tamper) as url:
        urls = {4: url}
        combined = run(enrol_subscriber(
            deployment.client(dave, order=(4, 1, 2, 3, 5), urls=urls), 'symbol = "IBM"'))
        assert combined.members == (1, 2, 3)
        assert [(f.index, "does not verify" in f.reason) for f in combined.failures] == [
            (4, True)]
        assert reads(deployment.pp, combined.key, published)
        # The control: the tampered share, combined without the check, reads nothing.
        tampered = raw_shares(deployment, dave, [1, 2], 'symbol = "IBM"')
        bad = T.decode_subscriber_share(GROUP, base64.b64decode(httpx.post(
            url + "/v3/enrol/subscriber", json={"subscription": 'symbol = "IBM"'},
            headers={"Authorization": f"Bearer {dave[4]['token']}"}).json()["share"]))
        assert not reads(deployment.pp, T.combine_subscriber_key(
            deployment.pp, deployment.tpk, [*tampered, bad]), published)


def trickle(handler, _body):
    try:
        handler.send_response(200)
        handler.send_header("content-length", "100000")
        handler.end_headers()
        for _ in range(60):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.3)
    except OSError:
        pass


#: A requester's binding V = ĝ^s, as a client draws it (scheme.md 16.3).
BINDING = GROUP.exp_secret(GROUP.generator(S.G2), 0xB1D)


def seeded(subscription, seed):
    """An enrolment's JSON body with the request seed and the binding."""
    return {"subscription": subscription, "request_seed": base64.b64encode(seed).decode(),
            "request_binding": base64.b64encode(bytes(BINDING)).decode()}


def signature_of(pp, secrets, identity, credential, epoch, expires_at, body, seed=None,
                 V=None):
    """A member's real request and partial signature (``secrets``) for ``identity``,
    derived from the seed and binding in the client's ``body`` (or ``seed``, ``V``), as
    the answer carries them."""
    sent = json.loads(body)
    seed = seed or base64.b64decode(sent["request_seed"])
    V = V or GROUP.deserialize(S.G2, base64.b64decode(sent["request_binding"]))
    request, partial = T.partial_sign_request(pp, secrets, identity, credential, epoch,
                                              expires_at, seed, V)
    return {"attribute": credential.attribute, "credential": credential.label(),
            "request": base64.b64encode(request).decode(),
            "signature": base64.b64encode(T.encode_partial_signature(partial)).decode()}


def test_hostile_members_fail_alone_and_steer_nobody(deployment, published):
    """Member 4, asked first, answers: a valid share of its own for epoch + 5 (made with
    its real secrets: the others must not be asked for that epoch), mallory's valid share
    (under ivan's name, or under mallory's), JSON nested 100,000 deep, an infinite
    expires_at, 600 KiB, or one byte every 0.3 s."""
    ivan = deployment.register("ivan", "subscriber")
    secrets = load_shares(deployment.dirs[3], PASSPHRASE)

    def future_epoch(handler, body):
        def own_share(share):
            key = share.key
            return T.keyshare_subscriber(deployment.pp, deployment.tpk, secrets, "ivan",
                                         key.epoch + 5, [k.credential for k in key.credentials],
                                         [f.credential for f in key.fine_tokens])
        with_share(handler, body, own_share,
                   request_signatures=signed_as(handler, body, "ivan", epochs_later=5))

    def signed_as(handler, body, identity, epochs_later=0):
        """Member 4's real request signatures, for ``identity`` and a later epoch."""
        real = handler.forward(body)
        return [signature_of(deployment.pp, secrets, identity,
                             Credential.from_label(r["credential"]),
                             real["epoch"] + epochs_later, real["expires_at"], body)
                for r in real["request_signatures"]]

    def mallorys(share):
        key = share.key
        return T.keyshare_subscriber(deployment.pp, deployment.tpk, secrets, "mallory",
                                     key.epoch, [k.credential for k in key.credentials],
                                     [f.credential for f in key.fine_tokens])

    def infinite_expiry(handler, body):
        document = handler.forward(body) | {"expires_at": float("inf")}
        handler.reply(json.dumps(document).encode())

    def earlier_release(handler, body):  # signatures without the request bodies
        document = handler.forward(body)
        document["request_signatures"] = [{k: v for k, v in r.items() if k != "request"}
                                          for r in document["request_signatures"]]
        handler.reply(json.dumps(document).encode())

    behaviours = {
        future_epoch: "agrees with fewer than 3",
        (lambda h, b: with_share(h, b, mallorys)): "does not verify",
        (lambda h, b: with_share(h, b, mallorys, identity="mallory",
                                 request_signatures=signed_as(h, b, "mallory"))): "fewer than 3",
        (lambda h, _: h.reply(b"[" * 100_000)): "not a share",
        infinite_expiry: "not a time",
        earlier_release: "earlier release",
        (lambda h, _: h.reply(b" " * max_answer_bytes(deployment.pp.schema) + b"{}")):
            "exceeds",
        trickle: "had not answered"}
    for behave, reason in behaviours.items():
        # The client waits for member 4 (a hedge of 5 s) but where it trickles: its forged
        # answers are made in this process, and in a full run under load one took longer
        # than members 1, 2 and 3 with a hedge of 0.5 s, so it was hedged past unread.
        with hostile_member(deployment.url(4), behave) as url:
            client = deployment.client(ivan, order=(4, 1, 2, 3, 5), urls={4: url},
                                       timeout=12, hedge=0.5 if behave is trickle else 5.0)
            started = time.monotonic()
            combined = run(enrol_subscriber(client, 'symbol = "IBM"'))
            assert time.monotonic() - started < 8  # not held until member 4's deadline
            assert combined.members == (1, 2, 3) and reads(deployment.pp, combined.key,
                                                           published)
            assert [f.index for f in combined.failures] == [4]
            assert reason in combined.failures[0].reason, combined.failures
    # A member that trickles its answer is given up at the deadline, not held on to.
    with hostile_member(deployment.url(4), trickle) as url:
        client = deployment.client(ivan, order=(4, 1, 2), urls={4: url}, timeout=2, hedge=10)
        started = time.monotonic()
        with pytest.raises(ThresholdEnrolmentError, match="no answer within 2 s"):
            run(enrol_subscriber(client, 'symbol = "IBM"'))
        assert time.monotonic() - started < 8  # the trickle would take 18 s



def test_connection_requests_are_signed_by_the_members_that_issued_the_keys(deployment):
    """Each credential's request verifies against X alone and opens for a covering
    credential only; a member that signs another request is named and replaced, and its
    signature in a request makes peers refuse it (the control)."""
    pp, anchor = deployment.pp, T.ThresholdServer(GROUP, deployment.tpk.X)
    alice = deployment.register("requester", "subscriber")
    combined = run(enrol_subscriber(deployment.client(alice, order=(2, 4, 5, 1, 3)),
                                    'symbol = "IBM" and price < 200'))
    assert combined.members == (2, 4, 5) and not combined.failures
    assert [r.credential for r in combined.requests] == [
        k.credential for k in combined.key.credentials] and len(combined.requests) >= 2
    now, epochs = time.time(), {combined.key.epoch}
    for issued in combined.requests:
        S.check_connection_request(pp, issued.request, anchor, now, epochs)
        assert issued.request.expires_at == combined.expires_at
        assert len(issued.secrets) == issued.credential.position + 1
    # no two requests of the enrolment carry the same binding: nothing links them
    assert len({bytes(r.request.binding) for r in combined.requests}) == len(combined.requests)
    symbol = next(r for r in combined.requests if r.attribute == "symbol")
    holder = run(enrol_subscriber(deployment.client(deployment.register("ib", "subscriber")),
                                  'symbol prefix "IB"')).key.credentials[0].token
    opening = S.open_connection_request(pp, holder, symbol.request)
    assert opening is not None and opening.sw == symbol.secrets[holder.position]
    proof = S.acceptance_proof(opening.sw, symbol.request, b"link")
    assert S.check_acceptance(symbol.secrets, symbol.request, proof, b"link") == \
        holder.position
    outsider = run(enrol_subscriber(deployment.client(deployment.register(
        "ms", "subscriber")), 'symbol prefix "MS"')).key.credentials[0].token
    assert S.open_connection_request(pp, outsider, symbol.request) is None

    secrets = load_shares(deployment.dirs[3], PASSPHRASE)
    other_seed = b"\x09" * S.REQUEST_SEED_BYTES

    def swapped(entry):
        """The real request with entries 1 and 2 swapped (its binding and entry 0 kept, so
        only agreement finds it), signed."""
        request = codec.decode_request_body(GROUP, base64.b64decode(entry["request"]))
        body = codec.encode_request_body(replace(request, entries=(
            request.entries[0], request.entries[2], request.entries[1],
            *request.entries[3:])))
        return entry | {"request": base64.b64encode(body).decode(),
                        "signature": base64.b64encode(T.encode_partial_signature(
                            T.partial_sign(GROUP, secrets, body))).decode()}

    def answers_another_request(change):
        """Member 4 answers its real share with requests it derived otherwise (``change``
        to :func:`signature_of`'s arguments), with the real requests and the partial
        signatures of others (``"partials only"``), or with other entries under the right
        binding (``"swapped"``)."""
        def behave(handler, body):
            document = handler.forward(body)
            real = document["request_signatures"]
            if change == "swapped":
                wrong = [swapped(r) for r in real]
            else:
                wrong = [signature_of(pp, secrets, "requester", Credential.from_label(
                    r["credential"]), document["epoch"], document["expires_at"], body,
                    **({"seed": other_seed} if change == "partials only" else change))
                    for r in real]
            if change == "partials only":
                wrong = [r | {"signature": w["signature"]}
                         for r, w in zip(real, wrong, strict=True)]
            handler.reply(json.dumps(document | {"request_signatures": wrong}).encode())
        return behave

    for change, reason in (({"seed": other_seed}, "is not the one asked for"),
                           ("swapped", "on the epoch, credentials, identity and connection "
                                       "requests"),
                           ("partials only", "connection requests do not verify"),
                           ({"V": GROUP.generator(S.G2)}, "is not the one asked for")):
        with hostile_member(deployment.url(4), answers_another_request(change)) as url:
            combined = run(enrol_subscriber(deployment.client(
                alice, order=(4, 1, 2, 3, 5), urls={4: url}), 'symbol = "IBM"'))
        assert combined.members == (1, 2, 3)
        assert [(f.index, reason in f.reason) for f in combined.failures] == [(4, True)], \
            combined.failures
        issued = combined.requests[0]
        S.check_connection_request(pp, issued.request, anchor, time.time(),
                                   {combined.key.epoch})
    # The control: members 1 and 2's partials with member 4's of another seed make a
    # request peers refuse; with member 4's of this seed they make one peers accept.
    seed, epoch, until = b"\x07" * 32, combined.key.epoch, combined.expires_at

    def partial(i, of_seed):
        return T.partial_sign_request(pp, load_shares(deployment.dirs[i - 1], PASSPHRASE),
                                      "requester", issued.credential, epoch, until, of_seed,
                                      BINDING)[1]

    request, _ = S.derive_connection_request(pp, "requester", issued.credential, epoch, until,
                                             seed, BINDING)
    honest = [partial(1, seed), partial(2, seed)]
    with pytest.raises(S.RequestRejected, match="signature"):
        S.check_connection_request(pp, T.signed_request(GROUP, deployment.tpk, request, [
            *honest, partial(4, other_seed)]), anchor, time.time(), {epoch})
    S.check_connection_request(pp, T.signed_request(GROUP, deployment.tpk, request, [
        *honest, partial(4, seed)]), anchor, time.time(), {epoch})

def test_requests_that_t_members_built_alike_but_not_from_the_seed_are_refused(deployment):
    """Members 1, 2 and 3 (another release, say) each sign the same body with entries 0
    and 1 swapped: the answers agree, so only the client's spot check of entry 0 against
    its seed finds it, and the enrolment fails naming them. The control: the same members
    answering as they are give requests that verify."""
    tokens = deployment.register("spot-checked", "subscriber", at=[1, 2, 3])

    def swapping(i):
        secrets = load_shares(deployment.dirs[i - 1], PASSPHRASE)

        def behave(handler, body):
            document = handler.forward(body)
            for entry in document["request_signatures"]:
                request = codec.decode_request_body(GROUP, base64.b64decode(entry["request"]))
                swapped = codec.encode_request_body(replace(request, entries=(
                    request.entries[1], request.entries[0], *request.entries[2:])))
                entry["request"] = base64.b64encode(swapped).decode()
                entry["signature"] = base64.b64encode(T.encode_partial_signature(
                    T.partial_sign(GROUP, secrets, swapped))).decode()
            handler.reply(json.dumps(document).encode())
        return behave

    combined = run(enrol_subscriber(deployment.client(tokens, order=(1, 2, 3)),
                                    'symbol = "IBM"'))
    assert combined.members == (1, 2, 3) and combined.requests  # the control
    with contextlib.ExitStack() as proxies:
        urls = {i: proxies.enter_context(hostile_member(deployment.url(i), swapping(i)))
                for i in (1, 2, 3)}
        with pytest.raises(ThresholdEnrolmentError, match="seed does not give") as refused:
            run(enrol_subscriber(deployment.client(tokens, order=(1, 2, 3), urls=urls),
                                 'symbol = "IBM"'))
    assert sorted(f.index for f in refused.value.failures) == [1, 2, 3]  # in answer order


def test_a_member_signs_requests_only_for_credentials_the_identity_may_hold(deployment):
    """The seed is all a client chooses: the member derives the requests for the
    credentials of the identity's policy, and refuses a seed that is not 32 bytes."""
    tokens = deployment.register("narrow", "subscriber", policy='symbol = "IBM"')
    headers = {"Authorization": f"Bearer {tokens[1]['token']}"}
    seed = b"\x05" * 32
    refused = httpx.post(deployment.url(1) + "/v3/enrol/subscriber", headers=headers,
                         json=seeded('symbol = "MSFT"', seed))
    assert refused.status_code == 403, refused.text
    answer = httpx.post(deployment.url(1) + "/v3/enrol/subscriber", headers=headers,
                        json=seeded('symbol = "IBM"', seed)).json()
    labels = [c for group in answer["credentials"].values() for c in group]
    assert [r["credential"] for r in answer["request_signatures"]] == labels
    assert answer["credentials"]["symbol"] == ['symbol:"IBM"$']
    without = httpx.post(deployment.url(1) + "/v3/enrol/subscriber", headers=headers,
                         json={"subscription": 'symbol = "IBM"'}).json()
    assert without["request_signatures"] == [] and without["share"] == answer["share"]
    good = seeded('symbol = "IBM"', seed)
    bads = [{"request_seed": bad} for bad in ("not base64!", "A" * 65,
                                             base64.b64encode(b"\x05" * 31).decode())]
    bads += [{"request_binding": base64.b64encode(bad).decode()} for bad in (
        bytes(GROUP.identity(S.G2)), bytes(BINDING)[:-1], bytes(GROUP.generator(S.G1)))]
    bads += [{"request_binding": None}, {"request_seed": None}]
    for change in bads:
        refused = httpx.post(deployment.url(1) + "/v3/enrol/subscriber", headers=headers,
                             json=good | change)
        assert refused.status_code == 422 and "request_" in refused.text, (change, refused.text)



def test_a_client_hedges_less_where_every_member_is_slow(deployment, published):
    """Every member answers after 1.5 s (a saturated deployment). With a hedge of 0.5 s
    the client's first enrolment asks two more members, whose work is thrown away (the
    control: the fixed delay); having seen the answer times, its next ones ask three."""
    tokens = deployment.register("patient", "subscriber")

    def slow(handler, body):
        time.sleep(1.5)
        handler.reply(json.dumps(handler.forward(body)).encode())

    with contextlib.ExitStack() as proxies:
        urls = {i: proxies.enter_context(hostile_member(deployment.url(i), slow))
                for i in range(1, n + 1)}

        async def three_enrolments():
            async with deployment.client(tokens, urls=urls, hedge=0.5) as client:
                return [await client.enrol_subscriber('symbol = "IBM"') for _ in range(3)]

        first, *later = run(three_enrolments())
    assert first.members == (1, 2, 3)
    assert sorted(f.index for f in first.failures) == [4, 5]  # hedged, thrown away
    assert all("had not answered" in f.reason for f in first.failures)
    for combined in later:
        assert combined.members == (1, 2, 3) and not combined.failures
        assert reads(deployment.pp, combined.key, published)

def test_keys_exist_only_where_t_members_allow_the_identity(deployment, published):
    # Registered at two members only: the other three refuse its token.
    erin = deployment.register("erin", "subscriber", at=[1, 2])
    with pytest.raises(ThresholdEnrolmentError) as refused:
        run(enrol_subscriber(deployment.client(erin), 'symbol = "IBM"'))
    assert sorted(f.index for f in refused.value.failures) == [3, 4, 5]
    assert "401" in str(refused.value)
    # A policy of IBM at members 1-3, none at 4-5: MSFT has only two members.
    frank = deployment.register("frank", "subscriber", at=[1, 2, 3], policy='symbol = "IBM"')
    frank |= deployment.register("frank", "subscriber", at=[4, 5])
    with pytest.raises(ThresholdEnrolmentError) as exceeded:
        run(enrol_subscriber(deployment.client(frank), 'symbol = "MSFT"'))
    assert sorted(f.index for f in exceeded.value.failures) == [1, 2, 3]
    allowed = run(enrol_subscriber(deployment.client(frank), 'symbol = "IBM"'))
    assert reads(deployment.pp, allowed.key, published)  # the control
    # Revoked at n - t + 1 = 3 members: no keys; at 2 (the control), keys.
    for name, revoked_at in (("grace", [1, 2]), ("heidi", [3, 4, 5])):
        tokens = deployment.register(name, "subscriber")
        for i in revoked_at:
            answer = httpx.post(deployment.url(i) + f"/v1/admin/identities/"
                                f"{tokens[i]['id']}/revoke",
                                headers={"Authorization": f"Bearer {deployment.admin[i]}"})
            assert answer.status_code == 200, answer.text
        if len(revoked_at) < n - t + 1:
            run(enrol_subscriber(deployment.client(tokens), 'symbol = "IBM"'))
        else:
            with pytest.raises(ThresholdEnrolmentError, match="revoked"):
                run(enrol_subscriber(deployment.client(tokens), 'symbol = "IBM"'))


def test_one_command_registers_at_every_member_and_revokes(deployment, published, tmp_path):
    """threshold-add registers at each member whose admin token it has and writes the
    access file a client reads; threshold-revoke at n - t + 1 members stops the identity
    (at 2, the control, it still gets keys). A member that refuses is named, the others
    still register."""
    access = tmp_path / "judy.json"
    added = threshold_identity(deployment, "add", "judy", range(1, n + 1), "--role",
                               "subscriber", "--allow", 'symbol = "IBM"',
                               "--access-file", str(access))
    assert added.returncode == 0, added.stderr
    assert "registered at 5 of 5 members" in added.stderr
    assert access.stat().st_mode & 0o777 == 0o600
    members = read_access_file(access)
    assert [m.index for m in members] == [1, 2, 3, 4, 5]

    async def enrol():
        async with ThresholdKeyClient(deployment.tpk, members) as client:  # schema signed
            return await client.enrol_subscriber('symbol = "IBM"')

    assert reads(deployment.pp, run(enrol()).key, published)
    again = threshold_identity(deployment, "add", "judy", [1], "--role", "subscriber",
                               "--access-file", str(access))
    assert again.returncode != 0 and "exists already" in again.stderr
    revoked = threshold_identity(deployment, "revoke", "judy", [1, 2])
    assert revoked.returncode == 0, revoked.stderr
    assert "once 3 (n - t + 1)" in revoked.stderr
    assert reads(deployment.pp, run(enrol()).key, published)  # the control: 3 still answer
    revoked = threshold_identity(deployment, "revoke", "judy", [3])
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(ThresholdEnrolmentError, match="revoked"):
        run(enrol())
    # Member 2's token file holds another identity's token: member 2 refuses and is named.
    wrong = tmp_path / "wrong.token"
    wrong.write_text(deployment.register("kate-decoy", "subscriber", at=[2])[2]["token"])
    partly = subprocess.run(cli_command(
        "identity", "threshold-add", "--deployment", str(deployment.dirs[0] / "threshold.json"),
        "--name", "kate", "--role", "subscriber", "--access-file", str(tmp_path / "kate.json"),
        "--admin-token-file", f"1={deployment.dirs[0] / 'admin.token'}",
        "--admin-token-file", f"2={wrong}"),
        env=child_env(), capture_output=True, text=True, timeout=120, check=False)
    assert partly.returncode != 0 and "members [2] did not register 'kate'" in partly.stderr
    assert "fewer than t = 3" in partly.stderr
    assert [m.index for m in read_access_file(tmp_path / "kate.json")] == [1]
    for bad, message in ((["--admin-token-file", "9=x"], "not in the deployment"),
                         (["--admin-token-file", "one"], "INDEX=FILE")):
        refused = subprocess.run(cli_command(
            "identity", "threshold-revoke", "--deployment",
            str(deployment.dirs[0] / "threshold.json"), "--name", "judy", *bad),
            env=child_env(), capture_output=True, text=True, timeout=120, check=False)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr


def test_identities_below_t_cannot_pool_their_shares(deployment, published):
    """docs/scheme.md 16.8, against real members: alice is registered at members 1 and 2,
    bob at member 3; each alone is refused, and their three shares combined read nothing
    (before the sharing of zero, they did). Control: three shares of one identity, fetched
    the same way, read."""
    alice = deployment.register("alice-pool", "subscriber", at=[1, 2])
    bob = deployment.register("bob-pool", "subscriber", at=[3])
    for tokens in (alice, bob):
        with pytest.raises(ThresholdEnrolmentError):
            run(enrol_subscriber(deployment.client(tokens), 'symbol = "IBM"'))
    pooled = (raw_shares(deployment, alice, [1, 2], 'symbol = "IBM"')
              + raw_shares(deployment, bob, [3], 'symbol = "IBM"'))
    assert not reads(deployment.pp, T.combine_subscriber_key(deployment.pp, deployment.tpk,
                                                             pooled), published)
    carol = deployment.register("carol-pool", "subscriber", at=[1, 2, 3])
    own = raw_shares(deployment, carol, [1, 2, 3], 'symbol = "IBM"')
    assert reads(deployment.pp, T.combine_subscriber_key(deployment.pp, deployment.tpk, own),
                 published)



def test_identities_below_t_cannot_pool_request_signatures(deployment):
    """16.8 for connection requests, against real members: alice (members 1 and 2) and bob
    (member 3) ask with one seed; their partial signatures combine into no request a peer
    accepts. Control: carol, at members 1, 2 and 3, asking the same way, gets one."""
    pp, anchor = deployment.pp, T.ThresholdServer(GROUP, deployment.tpk.X)
    seed = b"\x0b" * S.REQUEST_SEED_BYTES
    body = seeded('symbol = "IBM"', seed)

    def answers(tokens, members):
        return [httpx.post(deployment.url(i) + "/v3/enrol/subscriber", json=body,
                           headers={"Authorization": f"Bearer {tokens[i]['token']}"}).json()
                for i in members]

    def request_of(identity, documents):
        first = documents[0]
        signature = next(r for r in first["request_signatures"]
                         if r["attribute"] == "symbol")
        credential = Credential.from_label(signature["credential"])
        partials = [T.decode_partial_signature(GROUP, base64.b64decode(next(
            r["signature"] for r in d["request_signatures"]
            if r["credential"] == signature["credential"]))) for d in documents]
        request, _ = S.derive_connection_request(pp, identity, credential, first["epoch"],
                                                 first["expires_at"], seed, BINDING)
        return T.signed_request(GROUP, deployment.tpk, request, partials), first["epoch"]

    alice = deployment.register("alice-requests", "subscriber", at=[1, 2])
    bob = deployment.register("bob-requests", "subscriber", at=[3])
    pooled = answers(alice, [1, 2]) + answers(bob, [3])
    for identity in ("alice-requests", "bob-requests"):
        request, epoch = request_of(identity, pooled)
        with pytest.raises(S.RequestRejected, match="signature"):
            S.check_connection_request(pp, request, anchor, time.time(), {epoch})
    carol = deployment.register("carol-requests", "subscriber", at=[1, 2, 3])
    request, epoch = request_of("carol-requests", answers(carol, [1, 2, 3]))
    S.check_connection_request(pp, request, anchor, time.time(), {epoch})

def test_a_roots_certificate_and_token_are_combined_from_t_members(deployment):
    """A root's certificate verifies against X alone (not an Ed25519 key), binds its
    attribute, transport key, epoch and expiry, and its token opens entry 0 of a
    subscriber's request, whose holder accepts the root's proof. A member that signs
    another transport key, or hands another identity's token share, is named and replaced
    (the control: its partial makes a certificate that does not verify). Only a root whose
    policy leaves the attribute whole gets one."""
    pp, anchor = deployment.pp, T.ThresholdServer(GROUP, deployment.tpk.X)
    transport = bytes(range(32))
    root = deployment.register("root-symbol", "root")
    combined = run(enrol_root(deployment.client(root, order=(2, 4, 5, 1, 3)), "symbol",
                              transport))
    cert = combined.certificate
    assert combined.members == (2, 4, 5) and not combined.failures
    assert (cert.attribute, cert.transport_key) == ("symbol", transport)
    assert cert.verify(anchor, "symbol", time.time())
    assert not cert.verify(anchor, "price") and not cert.verify(anchor, now=cert.expires_at + 1)
    assert not cert.verify(Ed25519Server(transport))
    for changed in (dict(attribute="price"), dict(transport_key=bytes(32)),
                    dict(epoch=cert.epoch + 1), dict(expires_at=cert.expires_at + 1)):
        assert not replace(cert, **changed).verify(anchor)
    subscriber = run(enrol_subscriber(deployment.client(
        deployment.register("under-root", "subscriber")), 'symbol = "IBM"'))
    issued = subscriber.requests[0]
    opening = S.open_connection_request(pp, combined.token, issued.request)
    assert opening is not None and opening.sw == issued.secrets[0]
    assert S.check_acceptance(issued.secrets, issued.request, S.acceptance_proof(
        opening.sw, issued.request, b"link"), b"link") == 0
    secrets = load_shares(deployment.dirs[3], PASSPHRASE)

    def signs_another_key(handler, body):
        document = handler.forward(body)
        message = root_certificate_message("symbol", bytes(32), document["epoch"],
                                           document["expires_at"])
        partial = T.partial_sign(GROUP, secrets, message)
        handler.reply(json.dumps(document | {"certificate": base64.b64encode(
            T.encode_partial_signature(partial)).decode()}).encode())

    def hands_another_token(handler, body):
        document = handler.forward(body)
        share = T.keyshare_token(pp, deployment.tpk, secrets, "mallory", document["epoch"],
                                 combined.token.credential)
        handler.reply(json.dumps(document | {"routing_token": base64.b64encode(
            T.encode_token_share(share)).decode()}).encode())

    def signs_an_expired_one(handler, body):
        document = handler.forward(body) | {"expires_at": int(time.time()) - 60}
        partial = T.partial_sign(GROUP, secrets, root_certificate_message(
            "symbol", transport, document["epoch"], document["expires_at"]))
        handler.reply(json.dumps(document | {"certificate": base64.b64encode(
            T.encode_partial_signature(partial)).decode()}).encode())

    for behave, reason in ((signs_another_key, "certificate signature does not verify"),
                           (signs_an_expired_one, "expired"),
                           (hands_another_token, "token share does not verify"),
                           (lambda h, _: h.reply(b" " * MAX_ANSWER_BYTES + b"{}"), "exceeds")):
        with hostile_member(deployment.url(4), behave) as url:
            again = run(enrol_root(deployment.client(root, order=(4, 1, 2, 3, 5),
                                                     urls={4: url}), "symbol", transport))
        assert again.members == (1, 2, 3) and again.certificate.verify(anchor)
        assert [(f.index, reason in f.reason) for f in again.failures] == [(4, True)], \
            again.failures
    message = root_certificate_message("symbol", transport, cert.epoch, cert.expires_at)
    honest = [T.partial_sign(GROUP, load_shares(deployment.dirs[i - 1], PASSPHRASE), message)
              for i in (1, 2)]
    wrong = T.partial_sign(GROUP, secrets, root_certificate_message(
        "symbol", bytes(32), cert.epoch, cert.expires_at))
    right = T.partial_sign(GROUP, secrets, message)
    assert not replace(cert, signature=bytes(T.combine_signatures(
        GROUP, deployment.tpk, [*honest, wrong]))).verify(anchor)
    assert replace(cert, signature=bytes(T.combine_signatures(
        GROUP, deployment.tpk, [*honest, right]))).verify(anchor)  # the control
    # Roles, policy and input, at a member as at a single server.
    narrow = deployment.register("root-narrow", "root", policy='symbol prefix "I"')
    key = base64.b64encode(transport).decode()
    for tokens, body, status in (
            (deployment.register("not-a-root", "subscriber"),
             {"attribute": "symbol", "transport_key": key}, 403),
            (narrow, {"attribute": "symbol", "transport_key": key}, 403),
            (narrow, {"attribute": "price", "transport_key": key}, 200),
            (root, {"attribute": "colour", "transport_key": key}, 422),
            (root, {"attribute": "symbol", "transport_key": "AAAA"}, 422)):
        answer = httpx.post(deployment.url(1) + "/v3/enrol/root", json=body,
                            headers={"Authorization": f"Bearer {tokens[1]['token']}"})
        assert answer.status_code == status, (body, answer.text)
    with pytest.raises(KeyServerError, match="32-byte"):
        run(enrol_root(deployment.client(root), "symbol", transport[:31]))


def test_the_directory_is_kept_at_every_member_and_merged_most_listed_first(deployment):
    """A root and a subscriber lease their certified addresses at every member; a lookup
    asks every member and merges: each address once, with how many members listed it. A
    hostile member that invents a root and leaves the subscriber out cannot put its root
    ahead of the real one nor hide the subscriber; one that is down, answers garbage or
    trickles its answer fails alone, without holding the lookup up for the timeout. Leases
    need certified addresses, and end at every member with a deregistration."""
    rooty, subby = deployment.register("dir-root", "root"), deployment.register("dir-sub",
                                                                               "subscriber")
    at_root, at_sub = (f"127.0.0.1:{free_port()}" for _ in "rs")
    run(certify(deployment.client(rooty), Ed25519PrivateKey.generate(), [at_root]))
    run(certify(deployment.client(subby), Ed25519PrivateKey.generate(), [at_sub]))
    run(enrol_subscriber(deployment.client(subby), 'symbol = "IBM"'))  # joins the tree

    async def directory(tokens, call, urls=None):
        async with deployment.client(tokens, urls=urls) as client:
            return await call(client)

    leased = run(directory(rooty, lambda c: c.register(at_root, "symbol", "root", 60)))
    assert leased.members == (1, 2, 3, 4, 5) and not leased.failures
    run(directory(subby, lambda c: c.register(at_sub, "symbol", "subscriber", 60, [at_root])))
    found = run(directory(rooty, lambda c: c.lookup("symbol")))
    assert [(e["address"], e["listed_by"], e["vouched"]) for e in found["roots"]] == [
        (at_root, 5, True)]
    assert [(e["address"], e["listed_by"]) for e in found["members"]] == [(at_sub, 5)]
    # The subscriber sees the tree at the 3 members that issued it keys for it (1, 2, 3).
    seen = run(directory(subby, lambda c: c.lookup("symbol")))
    assert [(e["address"], e["listed_by"]) for e in seen["roots"]] == [(at_root, 3)]

    invented = "127.0.0.1:1"

    def lying(handler, _body):
        listing = handler.forward(None)
        listing["roots"].insert(0, {"address": invented, "role": "root",
                                    "expires_at": time.time() + 86400, "vouched": True})
        listing["members"] = []
        handler.reply(json.dumps(listing).encode())

    def trickling(handler, _body):  # answers the first byte of its listing, then waits
        handler.reply(b"{", length=1000)
        time.sleep(25)

    with hostile_member(deployment.url(2), lying) as liar, hostile_member(
            deployment.url(4), lambda handler, _: handler.reply(b'{"attribute": 1}')) as junk, \
            hostile_member(deployment.url(3), trickling) as slow:
        started = time.monotonic()
        merged = run(directory(rooty, lambda c: c.lookup("symbol"),
                               urls={2: liar, 3: slow, 4: junk}))
        took = time.monotonic() - started
    assert [(e["address"], e["listed_by"]) for e in merged["roots"]] == [
        (at_root, 3), (invented, 1)]
    assert [(e["address"], e["listed_by"]) for e in merged["members"]] == [(at_sub, 2)]
    assert took < 10, took  # 3 answered: the hedge delay (2 s), not the timeout (20 s)
    # Control: in the liar's own answer its root is as good as the real one (listed by one
    # member each); only the count of members puts the real one first.
    with hostile_member(deployment.url(2), lying) as liar:
        alone = run(directory(rooty, lambda c: c.lookup("symbol"),
                              urls={i: DOWN for i in (1, 3, 4, 5)} | {2: liar}))
    assert sorted((e["address"], e["listed_by"]) for e in alone["roots"]) == sorted(
        [(invented, 1), (at_root, 1)])
    assert alone["members"] == []

    with pytest.raises(ThresholdEnrolmentError, match="no member took the lease") as refused:
        run(directory(rooty, lambda c: c.register(f"127.0.0.1:{free_port()}", "symbol",
                                                  "root", 60)))
    assert len(refused.value.failures) == 5 and all(
        "403" in f.reason and "not certified to this identity" in f.reason
        for f in refused.value.failures)
    with pytest.raises(ThresholdEnrolmentError, match="no member listed the tree 'price'"):
        run(directory(subby, lambda c: c.lookup("price")))  # not its tree: 403 everywhere
    removed = run(directory(rooty, lambda c: c.deregister(at_root)))
    assert removed.members == (1, 2, 3, 4, 5)
    assert run(directory(rooty, lambda c: c.lookup("symbol")))["roots"] == []


def test_the_documented_directory_program_leases_and_finds_a_root(deployment, tmp_path):
    """docs/operations.md's directory program, verbatim: a root identity added at every
    member leases its certified address at all five and finds it listed by all five."""
    documented_program("threshold-directory-example", tmp_path / "directory.py")
    added = threshold_identity(deployment, "add", "dir-doc", range(1, n + 1), "--role",
                               "root", "--access-file", str(tmp_path / "dir-doc.json"))
    assert added.returncode == 0, added.stderr
    address = f"127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "directory.py",
                           str(deployment.dirs[0] / "threshold.json"), "dir-doc.json",
                           "volume", address], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{address} leased at members [1, 2, 3, 4, 5]", done.stdout
    assert f"root {address}: listed by 5 members" in lines[1:], done.stdout


def test_two_members_killed_mid_burst_fail_no_issuance(deployment, published):
    """Last in this module: 48 enrolments by 8 identities, 8 at a time; members 1 and 2
    are killed once 20 have their keys."""
    tokens = [deployment.register(f"burst-{k}", "subscriber") for k in range(8)]
    asks = [(tokens[k % 8], f'symbol = "IBM" and price < {132 + k}') for k in range(48)]
    done = []

    async def one(ask, slots):
        async with slots, deployment.client(ask[0], spread=True) as client:
            combined = await client.enrol_subscriber(ask[1])
        done.append(combined)
        if len(done) == 20:
            for i in (1, 2):
                deployment.processes[i].send_signal(signal.SIGKILL)
        return combined

    async def burst():
        slots = asyncio.Semaphore(8)
        return 20, await asyncio.gather(*(one(ask, slots) for ask in asks))

    before_kill, results = asyncio.run(burst())
    assert before_kill < len(asks) // 2 and deployment.processes[1].wait(10) < 0
    assert len(results) == len(asks)  # every enrolment got its keys
    assert all(reads(deployment.pp, r.key, published) for r in results)
    routed_around = [f for r in results for f in r.failures if f.index in (1, 2)]
    assert any("unreachable" in f.reason for f in routed_around)
    # Others are: hedged past (a busy member had not answered when three others agreed).
    assert all("unreachable" in f.reason or "had not answered" in f.reason
               for f in routed_around)
    # After the burst: members 1 and 2 are down, asked first, and skipped.
    after = run(enrol_subscriber(deployment.client(tokens[0]), 'symbol = "IBM"'))
    assert after.members == (3, 4, 5) and sorted(f.index for f in after.failures) == [1, 2]


def test_bench_keyserver_threshold_smoke(tmp_path):
    """The benchmark's command, briefly: 2 of 3 members against the single server."""
    out = tmp_path / "threshold.json"
    done = subprocess.run(cli_command(
        "bench", "keyserver", "--threshold", "2-of-3", "--json", str(out), "--seconds", "1",
        "--clients", "2", "--workers", "1", "--max-credentials", "1", "--no-plot"),
        env=child_env(), capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert (summary["t"], summary["n"]) == (2, 3) and summary["members_skipped"] == 0
    assert result["threshold"]["enrolments"] >= 1 and summary["threshold_keys_per_second"] > 0
    assert summary["cpu_per_key_vs_t_floor_keys"] == pytest.approx(
        summary["threshold_cpu_seconds_per_key"] / (2 * summary["floor_cpu_seconds_per_key"]),
        rel=0.01)
    assert summary["threshold_cpu_seconds_per_key"] == pytest.approx(
        summary["members_cpu_seconds_per_key"] + summary["client_cpu_seconds_per_key"], rel=0.01)
    assert summary["members_cpu_seconds_per_key"] > 0 and summary["client_cpu_seconds_per_key"] > 0
    refused = subprocess.run(cli_command("bench", "keyserver", "--threshold", "3-of-4"),
                             env=child_env(), capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2 and "3-of-4" in refused.stderr

