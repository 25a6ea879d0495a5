"""The threshold key service's set-up without a dealer, among key servers (3 of 5).

First the protocol machine with hostile members (each attack with a control that the same
code passes when the member behaves), then the real command: five `keyserver
threshold-setup` processes on 127.0.0.1, whose outcome is checked by combining keys and
signatures from their sealed shares (only this test reads them all)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.decomposition import decompose
from ibe_pubsub.credentials.dkg import Participant
from ibe_pubsub.credentials.groups import G2
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.shamir import evaluate, lagrange_at_zero
from ibe_pubsub.evaluation.threshold_lab import drive
from ibe_pubsub.keyserver.setup_protocol import (
    Member,
    RefusedMessage,
    SetupError,
    SetupMember,
    SetupPlan,
    raw_public_key,
)
from ibe_pubsub.keyserver.threshold_store import load_shares, read_public_document

t, n, EPOCH = 3, 5, 4
EVENT = S.Event("quote-1", {"symbol": "IBM", "price": 131.5, "volume": 2000}, b"hello")
GROUP = load_group()


def plan_of(keys, t=t, deployment="test"):
    return SetupPlan(deployment, t, tuple(Member(f"http://member-{i}", raw_public_key(k))
                                          for i, k in enumerate(keys, start=1)))


def members_of(plan, keys, kinds=None):
    kinds = kinds or {}
    return [kinds.get(i, SetupMember)(GROUP, plan, k) for i, k in enumerate(keys, start=1)]


def credentials(pp, subscription):
    parts = decompose(pp.schema, parse_predicate(pp.schema, subscription))
    return [c for cs in parts.values() for c in cs]


def reads(pp, key, ciphertext):
    try:
        return S.decrypt(pp, S.prepare_subscriber_key(pp, key), ciphertext) == EVENT
    except S.SchemeError:
        return False


def check_outcome(tpk, secrets):
    """What the set-up must give: keys combined from any ``t`` servers decrypt and sign
    (publisher keys from servers 2, 4, 5, subscriber keys from 1, 2, 3 and from 3, 4, 5),
    two servers' shares mixed with any weights do not, and threshold signatures verify."""
    pp = S.PublicParams(GROUP, tpk.mpk, default_schema())
    publisher = [T.combine_publisher_key(pp, tpk, [
        T.keyshare_publisher(pp, tpk, secrets[i], "pub", c, EPOCH) for i in (2, 4, 5)])
        for c in credentials(pp, "")]
    ciphertext = S.encrypt_and_sign(pp, publisher, EVENT)
    assert S.verify(pp, ciphertext)
    wanted = credentials(pp, 'symbol = "IBM"')
    for servers in ((1, 2, 3), (3, 4, 5)):
        shares = [T.keyshare_subscriber(pp, tpk, secrets[i], "alice", EPOCH, wanted)
                  for i in servers]
        assert all(T.verify_subscriber_share(pp, tpk, s, "alice", EPOCH, wanted)
                   for s in shares)
        assert reads(pp, T.combine_subscriber_key(pp, tpk, shares), ciphertext)
    two = [T.keyshare_subscriber(pp, tpk, secrets[i], "alice", EPOCH, wanted) for i in (1, 2)]
    weights = lagrange_at_zero((1, 2), GROUP.order)
    mixed = S.SubscriberKey(EPOCH, GROUP.multi_exp([s.key.D for s in two],
                                                   [weights[1], weights[2]]), tuple(
        replace(k, S1=GROUP.multi_exp([s.key.credentials[m].S1 for s in two],
                                      [weights[1], weights[2]]))
        for m, k in enumerate(two[0].key.credentials)))
    assert not reads(pp, mixed, ciphertext)
    pooled = [T.keyshare_subscriber(pp, tpk, secrets[i], who, EPOCH, wanted)
              for i, who in ((1, "alice"), (2, "alice"), (3, "bob"))]
    assert not reads(pp, T.combine_subscriber_key(pp, tpk, pooled), ciphertext)
    partials = [T.partial_sign(GROUP, secrets[i], b"schema") for i in (1, 3, 5)]
    assert T.verify_signature(GROUP, tpk.X, b"schema",
                              T.combine_signatures(GROUP, tpk, partials))


# -- the protocol, with hostile members ----------------------------------------------------------

@pytest.fixture(scope="module")
def keys():
    return [Ed25519PrivateKey.generate() for _ in range(n)]


def test_five_honest_members_agree_on_one_public_key_whose_keys_work(keys):
    members = members_of(plan_of(keys), keys)
    drive(members)
    results = [m.result for m in members]
    assert all(r is not None for r in results)
    assert len({T.encode_public_key(r.public_key) for r in results}) == 1
    assert all(q == frozenset(range(1, n + 1)) for r in results for q in r.qualified.values())
    check_outcome(results[0].public_key, {r.secrets.index: r.secrets for r in results})


class BadShareTo2(SetupMember):
    """Deals a share to member 2 that does not open; ``honest_answer`` says whether it then
    reveals the right share when member 2 complains."""

    honest_answer = True

    def _deal(self) -> bytes:
        body = msgpack.unpackb(super()._deal(), strict_map_key=False)
        body["phi"][1][2] = bytes(len(body["phi"][1][2]))
        return msgpack.packb(body)

    def _answer(self) -> bytes:
        body = msgpack.unpackb(super()._answer(), strict_map_key=False)
        if not self.honest_answer:
            body["answers"]["phi"] = [[a, (1).to_bytes(32, "big")]
                                      for a, _ in body["answers"]["phi"]]
        return msgpack.packb(body)


class WrongAnswer(BadShareTo2):
    honest_answer = False


def test_a_dealer_that_sends_a_bad_share_is_accused_and_stays_only_if_it_answers(keys):
    for kind, stays in ((BadShareTo2, True), (WrongAnswer, False)):
        members = members_of(plan_of(keys), keys, {1: kind})
        drive(members)
        complaints = msgpack.unpackb(msgpack.unpackb(members[1].published("complain"))[3],
                                     strict_map_key=False)["complaints"]
        assert complaints["phi"] == [1] and complaints["delta"] == []
        results = [m.result for m in members]
        assert len({T.encode_public_key(r.public_key) for r in results}) == 1
        qualified = results[0].qualified
        assert (1 in qualified["phi"]) is stays and 1 in qualified["delta"]
        check_outcome(results[0].public_key, {r.secrets.index: r.secrets for r in results})


class IdentityCommitment(SetupMember):
    """Deals an ``x`` whose constant term commits to the identity, and a ``rho`` with a
    constant term of its own (a C_0 sent along): disqualified for both."""

    def _deal(self) -> bytes:
        body = msgpack.unpackb(super()._deal(), strict_map_key=False)
        body["x"][0][0] = bytes(GROUP.identity(G2))
        body["rho"][0].insert(0, bytes(GROUP.generator(G2)))
        return msgpack.packb(body)


def test_a_malformed_dealing_is_disqualified_and_the_others_finish(keys):
    members = members_of(plan_of(keys), keys, {4: IdentityCommitment})
    drive(members)
    qualified = members[0].result.qualified
    assert qualified["x"] == qualified["rho"] == {1, 2, 3, 5}
    assert qualified["delta"] == set(range(1, 6))
    check_outcome(members[0].result.public_key,
                  {m.result.secrets.index: m.result.secrets for m in members})


class Equivocator(SetupMember):
    """Signs a second deal, of other polynomials, to show member 5 instead."""

    def _deal(self) -> bytes:
        first, honest = super()._deal(), self._dkg
        self._dkg = {name: Participant(self.group, self.index, self.plan.t, self.plan.n,
                                      p.zero) for name, p in honest.items()}
        self.second = self._envelope("deal", super()._deal())
        self._dkg = honest
        return first


def test_a_member_that_sends_different_deals_to_different_members_stops_the_setup(keys):
    members = members_of(plan_of(keys), keys, {3: Equivocator})

    def equivocate(recipient, sender, round_name, data):
        return members[2].second if (sender, round_name, recipient) == (3, "deal", 5) \
            else data

    with pytest.raises(SetupError, match="saw other deal messages"):
        drive(members, equivocate)
    control = members_of(plan_of(keys), keys)
    drive(control, lambda recipient, sender, round_name, data: data)
    assert all(m.result is not None for m in control)


class KnownBeta(SetupMember):
    """The last member replaces the ceremony's state with ``(g2^z, g2^(1/z), ĝ^z)`` for a
    ``z`` it knows, with a proof made from that ``z``: it would know ``beta``."""

    def _beta_step(self) -> bytes:
        group, z = self.group, 12345
        g2, g_hat = self._g2, group.generator(G2)
        return msgpack.packb([bytes(g2 ** z), bytes(g2 ** pow(z, -1, group.order)),
                              bytes(g_hat ** z), bytes(g_hat), (0).to_bytes(32, "big")])


def test_a_member_that_chooses_beta_is_refused_by_name(keys):
    members = members_of(plan_of(keys), keys, {5: KnownBeta})
    with pytest.raises(SetupError, match="member 5's beta step is refused"):
        drive(members)


def test_a_message_in_another_members_name_is_refused_and_the_true_one_accepted(keys):
    plan = plan_of(keys)
    members = members_of(plan, keys)
    genuine = members[2].published("hello")
    forged = msgpack.unpackb(genuine)
    forged[4] = keys[3].sign(b"anything")  # member 4 signs in member 3's name
    with pytest.raises(RefusedMessage, match="member 3's name"):
        members[0].receive(msgpack.packb(forged))
    for noise in (b"", b"\x00" * 100, msgpack.packb([1, 2, 3])):
        with pytest.raises(RefusedMessage):
            members[0].receive(noise)
    members[0].receive(genuine)
    assert 3 not in [s for s, r in members[0].missing() if r == "hello"]


def test_members_with_different_plans_stop_at_once_naming_the_other(keys):
    members = members_of(plan_of(keys), keys)
    other = SetupMember(GROUP, plan_of(keys, deployment="another"), keys[1])
    with pytest.raises(SetupError, match="member 2 runs a different plan"):
        members[0].receive(other.published("hello"))
    # The epoch length is part of the plan: members that would number epochs apart stop too.
    plan = plan_of(keys)
    shorter = SetupMember(GROUP, SetupPlan(plan.deployment, plan.t, plan.members, 600),
                          keys[2])
    with pytest.raises(SetupError, match="member 3 runs a different plan"):
        members[0].receive(shorter.published("hello"))
    with pytest.raises(SetupError, match="half the epoch"):
        SetupPlan(plan.deployment, plan.t, plan.members, 600, 400)


def test_plans_that_give_one_server_the_keys_are_refused(keys):
    for threshold, count, message in ((1, 3, "below 2"), (3, 4, "at least 5")):
        with pytest.raises(SetupError, match=message):
            plan_of(keys[:count], t=threshold)
    with pytest.raises(SetupError, match="not one of the plan's members"):
        SetupMember(GROUP, plan_of(keys), Ed25519PrivateKey.generate())


def test_hellos_of_an_earlier_run_replayed_reveal_no_share(keys):
    """A network attacker records the hellos of a run it then blocks, and shows them to the
    members when the operators run the same plan again. Were the shares sealed to keys of
    the old run, every member would complain about every dealer, and the answers would
    reveal ``n - 1 >= t`` points of every polynomial: the secrets. Signed under the session
    (a digest of the hellos each member took), the deals are refused instead and nothing is
    revealed. The control: the replay of a hello that is the current one changes nothing."""
    plan = plan_of(keys)
    old = {m.index: m.published("hello") for m in members_of(plan, keys)}
    members = members_of(plan, keys)
    with pytest.raises(RefusedMessage, match="for this session"):
        drive(members, lambda recipient, sender, round_name, data:
              old[sender] if round_name == "hello" and recipient == 1 else data)
    assert all(m.published("answer") is None for m in members)
    control = members_of(plan, keys)
    current = {m.index: m.published("hello") for m in control}
    drive(control, lambda recipient, sender, round_name, data:
          current[sender] if round_name == "hello" else data)
    assert all(m.result is not None for m in control)


def test_beta_steps_of_an_earlier_run_are_refused(keys):
    """Step 1 starts from the same state in every run of a plan, so an earlier run's chain
    would verify: replayed, it would replace the members' own steps. Signed under the
    session, it is refused (before the hellos, and after)."""
    plan = plan_of(keys)
    earlier = members_of(plan, keys)
    drive(earlier)
    old = {m.index: m.published("beta") for m in earlier}
    members = members_of(plan, keys)
    with pytest.raises(RefusedMessage, match="before this member had every hello"):
        members[3].receive(old[1])
    drive(members)
    with pytest.raises(RefusedMessage, match="for this session"):
        members[3].receive(old[1])
    assert members[3].result.public_key.W != earlier[3].result.public_key.W


class ZeroShare(SetupMember):
    """Member 5 deals last, once it holds every other deal, with a polynomial chosen so that
    its share of ``x`` is zero (a rushing dealer)."""

    def _next_message(self) -> bool:
        if "deal" in self._published or not self._have_all("hello"):
            return super()._next_message()
        if self._session is None:
            self._take_hellos()
        others = [d for d in self._bodies["deal"] if d != self.index]
        if len(others) < self.plan.n - 1:
            return False
        total = sum(self._open_share(d, "x", self._dealing(d, self._bodies["deal"][d],
                                                            "x")[1]) for d in others)
        participant = self._dkg["x"]
        polynomial = list(participant._polynomial)
        polynomial[0] = (polynomial[0] - evaluate(polynomial, self.index, GROUP.order)
                         - total) % GROUP.order
        participant._polynomial = tuple(polynomial)
        self._publish("deal", self._deal())
        return True


def test_a_dealer_that_cancels_its_own_share_is_named(keys):
    members = members_of(plan_of(keys), keys, {5: ZeroShare})
    drive(members)
    for sender in range(1, 5):  # it fetches the others' deals before publishing its own
        members[4].receive(members[sender - 1].published("deal"))
    with pytest.raises(SetupError, match="member 5's share of x would be zero"):
        drive(members)


def test_a_message_encoded_otherwise_on_the_way_blames_nobody(keys):
    """Re-encoding keeps a signature valid (a 32-byte string as bin16 instead of bin8): it
    must not read as a member that signed two messages or showed different deals."""

    def reencode(recipient, sender, round_name, data):
        if recipient != 5:
            return data
        fields = msgpack.unpackb(data)
        return b"\x95" + b"".join(
            b"\xc5" + len(f).to_bytes(2, "big") + f if isinstance(f, bytes)
            else msgpack.packb(f) for f in fields)

    members = members_of(plan_of(keys), keys)
    drive(members, reencode)
    assert len({T.encode_public_key(m.result.public_key) for m in members}) == 1


def hostile(round_name, change):
    """A member that publishes ``change(body)`` instead of its ``round_name`` body."""

    class Hostile(SetupMember):
        def _publish(self, name, body):
            super()._publish(name, change(body) if name == round_name else body)

    return Hostile


def test_malformed_messages_disqualify_or_stop_by_name_and_never_crash(keys):
    """Each malformed message from member 1: a deal that does not parse is no dealing (its
    dealer is not qualified, the others finish); a hello, complaint or beta step that does
    not parse stops the set-up with an error naming member 1 (never another exception)."""
    def deal_with(value):
        def change(body):
            parsed = msgpack.unpackb(body, strict_map_key=False)
            parsed["x"][0] = value
            return msgpack.packb(parsed)
        return change

    for change in (deal_with([]), deal_with([2**64 - 1] * t), deal_with("junk")):
        members = members_of(plan_of(keys), keys, {1: hostile("deal", change)})
        drive(members)
        assert members[1].result.qualified["x"] == {2, 3, 4, 5}
    for round_name, change in (("hello", lambda body: bytes(32)),
                               ("complain", lambda body: b"\x81\x91\x01\x01"),
                               ("beta", lambda body: msgpack.packb([2**64 - 1] * 5))):
        members = members_of(plan_of(keys), keys, {1: hostile(round_name, change)})
        with pytest.raises(SetupError, match="member 1"):
            drive(members)


# -- the real command: five processes ------------------------------------------------------------

def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def cli(*args, env, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "ibe_pubsub.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.fixture(scope="module")
def member_dirs(tmp_path_factory):
    """Five data directories, each with its member key; the --members list."""
    env = os.environ | {"IBE_PUBSUB_PASSPHRASE": "threshold test passphrase"}
    root = tmp_path_factory.mktemp("threshold")
    dirs = [root / f"server-{i}" for i in range(1, n + 1)]
    made = [cli("keyserver", "member-key", "--data", str(d), env=env) for d in dirs]
    outputs = [p.communicate(timeout=60) for p in made]
    assert all(p.returncode == 0 for p in made), outputs
    keys = [out.strip() for out, _ in outputs]
    return env, dirs, keys


def members_flag(keys, ports):
    return ",".join(f"{k}@http://127.0.0.1:{p}" for k, p in zip(keys, ports, strict=True))


def test_five_keyserver_processes_run_the_setup_and_agree(member_dirs):
    env, dirs, keys = member_dirs
    members = members_flag(keys, free_ports(n))
    # Member 1's operator keeps the plan in a TOML file instead (the list form).
    config = dirs[0].parent / "setup.toml"
    config.write_text('[keyserver.threshold-setup]\ndeployment = "acme"\nthreshold = 3\n'
                      f"members = {json.dumps(members.split(','))}\n")
    runs = [cli("keyserver", "threshold-setup", "--data", str(dirs[0]), "--config",
                str(config), env=env)]
    config.write_text(config.read_text() + "epoch-seconds = 600\n")
    runs += [cli("keyserver", "threshold-setup", "--data", str(d), "--deployment", "acme",
                 "--threshold", str(t), "--members", members, "--timeout", "120",
                 "--epoch-seconds", "600", env=env)
             for d in dirs[1:]]
    outputs = [p.communicate(timeout=180) for p in runs]
    assert all(p.returncode == 0 for p in runs), outputs
    fingerprints = {out.strip() for out, _ in outputs}
    assert len(fingerprints) == 1 and len(fingerprints.pop()) == 32
    assert "member 3 of 5" in outputs[2][1] and "round done" in outputs[2][1]
    documents = [json.loads((d / "threshold.json").read_text()) for d in dirs]
    assert all(doc == documents[0] for doc in documents)
    for d in dirs:
        assert (d / "threshold.sealed").stat().st_mode & 0o077 == 0
        assert (d / "member.sealed").stat().st_mode & 0o077 == 0
    passphrase = env["IBE_PUBSUB_PASSPHRASE"]
    plan, tpk = read_public_document(dirs[0] / "threshold.json", GROUP)
    assert plan.t == t and plan.n == n and tpk.deployment == b"acme"
    assert (documents[0]["epoch_seconds"], documents[0]["grace_seconds"]) == (600, 150)
    secrets = {i: load_shares(d, passphrase) for i, d in enumerate(dirs, start=1)}
    assert all(s.index == i for i, s in secrets.items())
    check_outcome(tpk, secrets)
    again = cli("keyserver", "threshold-setup", "--data", str(dirs[0]), "--deployment", "acme",
                "--threshold", str(t), "--members", members, env=env)
    _, err = again.communicate(timeout=60)
    assert again.returncode != 0 and "took part in a set-up already" in err


def check_what_member_1_serves(url, key_text):
    """Its status, its own signed hello, 404 for what it has not published (nobody can
    deal while member 5 is missing), and no way to write."""
    deadline = time.monotonic() + 30
    while True:
        try:
            status = httpx.get(f"{url}/v3/setup", timeout=2)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "member 1 never served"
            time.sleep(0.1)
    assert status.json()["member"] == 1 and status.json()["published"] == ["hello"]
    _, sender, round_name, body, signature = msgpack.unpackb(
        httpx.get(f"{url}/v3/setup/hello").content)
    assert (sender, round_name) == (1, "hello")
    member_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(key_text))
    plan_digest = bytes.fromhex(status.json()["plan"])
    member_key.verify(signature, b"IBE-PUBSUB-V3-SETUP" + plan_digest + b"\0"
                      + (1).to_bytes(4, "big") + b"hello\0" + body)
    unpublished = httpx.get(f"{url}/v3/setup/deal")
    assert unpublished.status_code == 404 and unpublished.json()["error"] == "not_published"
    assert httpx.get(f"{url}/v3/setup/nothing").status_code == 404
    assert httpx.post(f"{url}/v3/setup/hello", content=b"x").status_code == 405


def test_a_missing_member_is_named_when_the_setup_times_out(tmp_path, member_dirs):
    env, _, keys = member_dirs
    ports = free_ports(n)
    fresh = []
    for i in range(2):
        made = cli("keyserver", "member-key", "--data", str(tmp_path / f"m{i}"), env=env)
        out, err = made.communicate(timeout=60)
        assert made.returncode == 0, err
        fresh.append(out.strip())
    members = members_flag([*fresh, *keys[2:]], ports)
    runs = [cli("keyserver", "threshold-setup", "--data", str(tmp_path / f"m{i}"),
                "--deployment", "acme", "--threshold", str(t), "--members", members,
                "--timeout", "5", env=env) for i in range(2)]
    check_what_member_1_serves(f"http://127.0.0.1:{ports[0]}", fresh[0])
    outputs = [p.communicate(timeout=60) for p in runs]
    assert all(p.returncode == 2 for p in runs), outputs
    err = outputs[0][1]
    assert "did not finish within 5 s" in err and f"member 5 (http://127.0.0.1:{ports[4]})" \
        in err and "Traceback" not in err
    wrong = cli("keyserver", "threshold-setup", "--data", str(tmp_path / "m0"), "--deployment",
                "acme", "--threshold", "3", "--members", members,
                env=env | {"IBE_PUBSUB_PASSPHRASE": "wrong"})
    _, err = wrong.communicate(timeout=60)
    assert wrong.returncode == 2 and "wrong passphrase" in err and "Traceback" not in err


def test_a_member_address_that_drips_its_answer_cannot_hold_the_timeout(keys):
    """An address that answers one byte a second: each fetch is cut at its own bound, so
    the set-up still ends at --timeout, naming that member."""
    from ibe_pubsub.keyserver.setup_http import run_setup

    async def drip(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(30):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(1)
        writer.close()

    async def main():
        ports = free_ports(3)
        plan = SetupPlan("drip", 2, tuple(Member(f"http://127.0.0.1:{p}", raw_public_key(k))
                                          for p, k in zip(ports, keys, strict=False)))
        server = await asyncio.start_server(drip, "127.0.0.1", ports[1])
        started = time.monotonic()
        try:
            with pytest.raises(SetupError, match="did not finish within 2 s") as failed:
                await run_setup(SetupMember(GROUP, plan, keys[0]), "127.0.0.1", ports[0],
                                timeout=2, linger=0, report=lambda line: None,
                                fetch_timeout=1)
        finally:
            server.close()
        assert time.monotonic() - started < 10
        assert f"member 2 (http://127.0.0.1:{ports[1]})" in str(failed.value)
        assert "TimeoutError" in str(failed.value)

    asyncio.run(main())


def test_a_member_initialised_with_other_epochs_refuses_the_plan_before_the_setup(
        tmp_path, member_dirs):
    """Its database says 600 s epochs: a plan of the default 3600 s is refused at once,
    before any share is sealed; the plan with its own epochs passes that check (and then
    waits for the other members, who never come)."""
    env, _, keys = member_dirs
    data = tmp_path / "m600"
    for command in (("keyserver", "init", "--data", str(data), "--epoch-seconds", "600"),
                    ("keyserver", "member-key", "--data", str(data))):
        made = cli(*command, env=env)
        out, err = made.communicate(timeout=120)
        assert made.returncode == 0, err
    members = members_flag([out.strip(), *keys[1:]], free_ports(n))
    setup = ("keyserver", "threshold-setup", "--data", str(data), "--deployment", "acme",
             "--threshold", str(t), "--members", members, "--timeout", "3")
    refused = cli(*setup, env=env)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 2 and "Traceback" not in err
    assert "initialised with 600 s epochs and a 150 s grace" in err and "3600 s and 300" in err
    assert not (data / "threshold.sealed").exists()
    agreed = cli(*setup, "--epoch-seconds", "600", env=env)
    _, err = agreed.communicate(timeout=60)
    assert agreed.returncode == 2 and "did not finish within 3 s" in err, err
