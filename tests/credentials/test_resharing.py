"""Resharing (docs/scheme.md 16.9): a 3-of-5 deployment's four secrets dealt again to a new
set of servers (a member replaced, another threshold), every server in this process.
The public keys stay, keys and signatures from the new shares work as before, old and
new shares do not mix, and cheating dealers are found; each attack with its control."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.decomposition import decompose
from ibe_pubsub.credentials.dkg import Complaint, DkgError, Justification, deal
from ibe_pubsub.credentials.groups import G2
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.resharing import ReshareDealer, ReshareRecipient
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.shamir import lagrange_at_zero
from ibe_pubsub.evaluation.threshold_lab import local_deployment

SECRETS = ("delta", "phi", "x", "rho")
EPOCH = 9
EVENT = S.Event("quote-1", {"symbol": "IBM", "price": 131.5, "volume": 2000}, b"hello")


@pytest.fixture(scope="module")
def old():
    """A 3-of-5 deployment, its public parameters and an event its publisher sent."""
    group = load_group()
    tpk, secrets = local_deployment(group, 3, 5, b"resharing-test")
    pp = S.PublicParams(group, tpk.mpk, default_schema())
    publisher = []
    for credential in credentials(pp, ""):
        shares = [T.keyshare_publisher(pp, tpk, secrets[i], "pub", credential, EPOCH)
                  for i in (1, 2, 3)]
        publisher.append(T.combine_publisher_key(pp, tpk, shares))
    return pp, tpk, secrets, S.encrypt_and_sign(pp, publisher, EVENT)


def credentials(pp, subscription):
    parts = decompose(pp.schema, parse_predicate(pp.schema, subscription))
    return [c for cs in parts.values() for c in cs]


def public_shares(tpk, name):
    return getattr(tpk, f"{name}_shares")


def reshare(group, tpk, secrets, dealers, t, n, cheat=None, answer=None, complain=None,
            deliver=None):
    """Old servers ``dealers`` deal each secret to new servers 1..n (threshold ``t``), each
    phase after the one before; returns every new server's result per secret and the
    complaints. ``cheat(name, dealer, dealing, shares)`` may replace what a dealer sends
    (a share left out is never sent); ``complain(made)`` the broadcast complaints, each
    with its sender (a false one, one sent twice); ``answer(justification)`` a dealer's
    answer (None: silent); ``deliver(recipient, answer)`` the answers a recipient gets for
    one that was sent."""
    results, complaints = {}, []
    for name in SECRETS:
        recipients = [ReshareRecipient(group, j, t, n, public_shares(tpk, name), tpk.t)
                      for j in range(1, n + 1)]
        dealing_of = {i: ReshareDealer(group, i, getattr(secrets[i], name), t, n)
                      for i in dealers}
        for i, dealer in dealing_of.items():
            dealing, shares = dealer.dealing()
            if cheat is not None:
                dealing, shares = cheat(name, i, dealing, dict(shares))
            for r in recipients:
                r.receive(i, dealing)
                if r.index in shares:
                    r.receive_share(i, shares[r.index])
        # (sender, complaint): the sender is whom the broadcast authenticated
        made = [(r.index, c) for r in recipients for c in r.complaints()]
        if complain is not None:
            made = complain(made)
        for sender, c in made:
            for r in recipients:
                r.receive(sender, c)
        for sender, c in made:
            given = dealing_of[c.dealer].answer(sender, c)
            given = answer(given) if answer is not None and given is not None else given
            if given is not None:
                for r in recipients:
                    for got in (deliver(r.index, given) if deliver is not None else [given]):
                        r.receive(got.dealer, got)
        results[name] = [r.finish() for r in recipients]
        complaints += [c for _, c in made]
    return results, complaints


def new_deployment(group, tpk, results, t, n):
    """The new public key (checked against the old keys) and every new server's secrets."""
    for name in SECRETS:  # every new server computed the same public shares and dealers
        assert len({tuple(bytes(r.public_shares[j]) for j in range(1, n + 1))
                    for r in results[name]}) == 1
        assert len({r.dealers for r in results[name]}) == 1
    new = T.reshared_public_key(group, tpk, t, n,
                                *(results[name][0].public_shares for name in SECRETS))
    return new, {j: T.ServerSecrets(j, *(results[name][j - 1].share for name in SECRETS),
                                    os.urandom(32)) for j in range(1, n + 1)}


def secret_of(group, shares_by_server):
    """What the scalar shares of some servers interpolate to at 0."""
    weights = lagrange_at_zero(shares_by_server, group.order)
    return sum(weights[i] * s for i, s in shares_by_server.items()) % group.order


def signature(group, tpk, secrets, servers, message=b"a schema"):
    return T.combine_signatures(group, tpk, [T.partial_sign(group, secrets[i], message)
                                             for i in servers])


def subscriber_key(pp, tpk, secrets, servers, subscription='symbol = "IBM"'):
    shares = [T.keyshare_subscriber(pp, tpk, secrets[i], "alice", EPOCH,
                                    credentials(pp, subscription)) for i in servers]
    assert all(T.verify_subscriber_share(pp, tpk, s, "alice", EPOCH,
                                         credentials(pp, subscription)) for s in shares)
    return T.combine_subscriber_key(pp, tpk, shares)


def reads(pp, key, ciphertext) -> bool:
    try:
        return S.decrypt(pp, S.prepare_subscriber_key(pp, key), ciphertext) == EVENT
    except S.SchemeError:
        return False


def test_a_replaced_member_leaves_every_public_key_and_signature_as_it_was(old):
    """Server 5 retires, a newcomer takes number 5: old servers 1-4 deal. The new public
    key decodes (its shares lie on polynomials through the old keys), signatures of any 3
    new servers equal the old ones under the same ``X``, and a subscriber key combined
    from new shares reads what the old publisher key encrypted."""
    pp, tpk, secrets, ciphertext = old
    group = pp.group
    results, complaints = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5)
    assert complaints == []
    new, new_secrets = new_deployment(group, tpk, results, 3, 5)
    again = T.decode_public_key(group, T.encode_public_key(new))
    assert T.encode_public_key(again) == T.encode_public_key(new)
    assert (codec.encode_mpk(new.mpk), new.W, new.G, new.X) == (
        codec.encode_mpk(tpk.mpk), tpk.W, tpk.G, tpk.X)
    assert all(public_shares(new, name) != public_shares(tpk, name) for name in SECRETS)
    for name in SECRETS:  # the same secret (rho: zero), shared anew
        assert secret_of(group, {i: getattr(new_secrets[i], name) for i in (2, 4, 5)}) == \
            secret_of(group, {i: getattr(secrets[i], name) for i in (1, 2, 3)})
    assert signature(group, new, new_secrets, (2, 4, 5)) == signature(group, tpk, secrets,
                                                                        (1, 3, 5))
    assert T.verify_signature(group, tpk.X, b"a schema",
                              signature(group, new, new_secrets, (1, 3, 5)))
    assert reads(pp, subscriber_key(pp, new, new_secrets, (1, 3, 5)), ciphertext)
    assert reads(pp, subscriber_key(pp, tpk, secrets, (2, 3, 4)), ciphertext)  # control
    assert not reads(pp, subscriber_key(pp, new, new_secrets, (1, 3, 5), 'symbol = "MSFT"'),
                     ciphertext)  # control: a key that does not match still does not read


def test_old_and_new_shares_do_not_combine(old):
    """The retired server's old shares are no use beside new ones: its partial signature and
    key share do not verify under the new public shares, and combined with two new
    servers' they give no signature and no key. The control: three new ones do."""
    pp, tpk, secrets, ciphertext = old
    group = pp.group
    results, _ = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5)
    new, new_secrets = new_deployment(group, tpk, results, 3, 5)
    message = b"a schema"
    retired = T.partial_sign(group, secrets[5], message)
    assert T.verify_partial_signature(group, tpk, message, retired)  # control: it was valid
    assert not T.verify_partial_signature(group, new, message, retired)
    mixed = T.combine_signatures(group, new, [
        T.partial_sign(group, new_secrets[1], message),
        T.partial_sign(group, new_secrets[2], message), retired])
    assert not T.verify_signature(group, new.X, message, mixed)
    assert T.verify_signature(group, new.X, message,
                              signature(group, new, new_secrets, (1, 2, 5), message))
    wanted = credentials(pp, 'symbol = "IBM"')
    old_share = T.keyshare_subscriber(pp, tpk, secrets[5], "alice", EPOCH, wanted)
    assert not T.verify_subscriber_share(pp, new, old_share, "alice", EPOCH, wanted)
    new_shares = [T.keyshare_subscriber(pp, new, new_secrets[i], "alice", EPOCH, wanted)
                  for i in (1, 2)]
    assert not reads(pp, T.combine_subscriber_key(pp, new, [*new_shares, old_share]),
                     ciphertext)
    for name in SECRETS:  # in scalars: two new shares and an old one miss the secret
        assert secret_of(group, {1: getattr(new_secrets[1], name),
                                 2: getattr(new_secrets[2], name),
                                 5: getattr(secrets[5], name)}) != \
            secret_of(group, {i: getattr(secrets[i], name) for i in (1, 2, 3)})


@pytest.mark.parametrize("dealers, t, n", [((1, 3, 5), 2, 3), ((2, 3, 4), 4, 7)])
def test_the_threshold_and_the_number_of_servers_change(old, dealers, t, n):
    """3 of 5 to 2 of 3 and to 4 of 7: any ``t`` new servers sign as the old ones did, and
    ``t - 1`` new shares interpolate to something else (the new threshold holds)."""
    pp, tpk, secrets, ciphertext = old
    group = pp.group
    results, _ = reshare(group, tpk, secrets, dealers, t, n)
    new, new_secrets = new_deployment(group, tpk, results, t, n)
    assert (new.t, new.n) == (t, n)
    expected = signature(group, tpk, secrets, (1, 2, 3))
    for servers in ((range(1, t + 1)), range(n - t + 1, n + 1)):
        assert signature(group, new, new_secrets, tuple(servers)) == expected
    for name in SECRETS:
        secret = secret_of(group, {i: getattr(secrets[i], name) for i in (1, 2, 3)})
        assert secret_of(group, {i: getattr(new_secrets[i], name)
                                 for i in range(1, t + 1)}) == secret
        assert secret_of(group, {i: getattr(new_secrets[i], name)
                                 for i in range(1, t)}) != secret
    assert reads(pp, subscriber_key(pp, new, new_secrets, tuple(range(1, t + 1))), ciphertext)


def test_a_dealer_that_deals_anything_but_its_share_is_left_out(old):
    """Old server 2 deals its share plus one (a consistent polynomial with valid private
    shares): its ``C_0`` is not its public share, so every new server leaves it out and
    the others carry the resharing; with only 3 old dealers, 2 of them honest, it cannot
    finish. The control: the same dealers, honest, all count."""
    pp, tpk, secrets, _ = old
    group = pp.group

    def shifted(name, dealer, dealing, shares):
        if dealer != 2:
            return dealing, shares
        return ReshareDealer(group, 2, getattr(secrets[2], name) + 1, 3, 5).dealing()

    results, complaints = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5, cheat=shifted)
    assert complaints == []  # its private shares were consistent with what it committed to
    assert {r.dealers for name in SECRETS for r in results[name]} == {frozenset({1, 3, 4})}
    new, new_secrets = new_deployment(group, tpk, results, 3, 5)
    assert signature(group, new, new_secrets, (3, 4, 5)) == signature(group, tpk, secrets,
                                                                        (1, 2, 3))
    with pytest.raises(DkgError, match="only 2 old servers"):
        reshare(group, tpk, secrets, (1, 2, 3), 3, 5, cheat=shifted)
    honest, _ = reshare(group, tpk, secrets, (1, 2, 3), 3, 5)  # the control
    assert {r.dealers for name in SECRETS for r in honest[name]} == {frozenset({1, 2, 3})}


@pytest.mark.parametrize("answered", ["truly", "wrongly", "never"])
def test_a_bad_private_share_draws_a_complaint_and_only_a_true_answer_keeps_the_dealer(
        old, answered):
    """Old server 1 sends new server 2 a wrong share (and new server 3 none): they complain.
    Revealing the true shares keeps it in, and server 2 ends with a correct share; a wrong
    answer, or none, leaves it out, and the resharing still finishes from 2, 3 and 4."""
    pp, tpk, secrets, _ = old
    group = pp.group

    def bad(name, dealer, dealing, shares):
        if dealer == 1:
            shares[2] += 1
            del shares[3]
        return dealing, shares

    def answer(justification):
        if answered == "never":
            return None
        if answered == "wrongly":
            return Justification(justification.dealer, justification.accuser,
                                 justification.share + 1)
        return justification

    results, complaints = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5, cheat=bad,
                                  answer=answer)
    assert sorted({(c.accuser, c.dealer) for c in complaints}) == [(2, 1), (3, 1)]
    expected = {1, 2, 3} if answered == "truly" else {2, 3, 4}
    assert {r.dealers for name in SECRETS for r in results[name]} == {frozenset(expected)}
    new, new_secrets = new_deployment(group, tpk, results, 3, 5)
    g_hat = group.generator(G2)
    assert all(group.exp_secret(g_hat, getattr(new_secrets[2], name))
               == public_shares(new, name)[2] for name in SECRETS)
    assert signature(group, new, new_secrets, (1, 2, 3)) == signature(group, tpk, secrets,
                                                                        (3, 4, 5))


def test_a_dealer_answers_no_complaint_in_another_servers_name_and_each_once(old):
    """Anyone could otherwise have an honest dealer reveal any new server's share (from
    ``t'`` new servers' shares the secret follows, an attack review showed with the
    retired server as the outsider), or disqualify every honest dealer by sending its
    complaint twice (two answers to one complaint disqualify). Control: the true author's
    complaint is answered, with the share the dealer sent it."""
    pp, tpk, secrets, _ = old
    group = pp.group
    dealer = ReshareDealer(group, 1, secrets[1].x, 3, 5)
    _, shares = dealer.dealing()
    for outsider in (3, 6, 0):
        with pytest.raises(DkgError, match="in the name of new server 2"):
            dealer.answer(outsider, Complaint(2, 1))
    assert dealer.answer(2, Complaint(2, 1)) == Justification(1, 2, shares[2])  # control
    assert dealer.answer(2, Complaint(2, 1)) is None  # answered already
    assert dealer.answer(3, Complaint(3, 2)) is None  # against another dealer

    def twice(made):  # new server 5 complains, falsely, against every dealer, twice
        return made + [(5, Complaint(5, i)) for i in (1, 2, 3, 4) for _ in range(2)]

    results, complaints = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5, complain=twice)
    assert len(complaints) == 8 * len(SECRETS)  # each secret
    assert {r.dealers for name in SECRETS for r in results[name]} == {frozenset({1, 2, 3})}


@pytest.mark.parametrize("delivered, kept", [("once", True), ("twice to some", True),
                                             ("with a different one", False)])
def test_an_answer_delivered_twice_counts_once_and_two_different_ones_disqualify(
        old, delivered, kept):
    """A transport that repeats an answer to some servers only must not make them disagree
    on the dealers (an attack review: the repeated answer disqualified the dealer there);
    a dealer that answers one complaint with two different shares is out everywhere."""
    pp, tpk, secrets, _ = old
    group = pp.group

    def missing(name, dealer, dealing, shares):
        if dealer == 1:
            del shares[2]
        return dealing, shares

    def deliver(recipient, given):
        if delivered == "twice to some":
            return [given, given] if recipient % 2 else [given]
        if delivered == "with a different one":
            return [given, Justification(given.dealer, given.accuser, given.share + 1)]
        return [given]

    results, complaints = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5, cheat=missing,
                                  deliver=deliver)
    assert {(c.accuser, c.dealer) for c in complaints} == {(2, 1)}
    expected = {1, 2, 3} if kept else {2, 3, 4}
    assert {r.dealers for name in SECRETS for r in results[name]} == {frozenset(expected)}
    new_deployment(group, tpk, results, 3, 5)  # every server computed the same


@pytest.mark.parametrize("fault", ["short", "long", "identity"])
def test_a_dealing_of_another_degree_or_with_an_identity_coefficient_is_left_out(old, fault):
    """A dealing with t' - 1 or t' + 1 commitments, or with an identity coefficient (which
    lowers the degree), is malformed: its dealer is left out everywhere, though its private
    shares agree with what it committed to (no complaint)."""
    pp, tpk, secrets, _ = old
    group = pp.group

    def malformed(name, dealer, dealing, shares):
        if dealer != 1:
            return dealing, shares
        share, q = getattr(secrets[1], name), group.order
        polynomial = {"short": (share, 5), "long": (share, 5, 6, 7),
                      "identity": (share, 0, 7)}[fault]
        return deal(group, 1, [a % q for a in polynomial], 5)

    results, complaints = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5, cheat=malformed)
    assert complaints == []
    assert {r.dealers for name in SECRETS for r in results[name]} == {frozenset({2, 3, 4})}


def test_messages_in_another_servers_name_or_from_outside_are_refused(old):
    """Dealings and answers in another old server's name, complaints in another new
    server's name, a dealer that is not an old server, second dealings or shares, and a
    new set with a threshold of 1 or fewer than 2t - 1 servers."""
    pp, tpk, secrets, _ = old
    group = pp.group
    recipient = ReshareRecipient(group, 1, 3, 5, tpk.x_shares, tpk.t)
    dealing, shares = ReshareDealer(group, 1, secrets[1].x, 3, 5).dealing()
    with pytest.raises(DkgError, match="in the name of old server 1"):
        recipient.receive(2, dealing)
    with pytest.raises(DkgError, match="not one of the old set"):
        recipient.receive(6, ReshareDealer(group, 6, 1, 3, 5).dealing()[0])
    with pytest.raises(DkgError, match="not one of the old set"):
        recipient.receive_share(6, 1)
    with pytest.raises(DkgError, match="in the name of new server 2"):
        recipient.receive(3, Complaint(2, 1))
    with pytest.raises(DkgError, match="in the name of old server 1"):
        recipient.receive(2, Justification(1, 3, shares[3]))
    for t, n in ((1, 3), (3, 4)):  # one server holding the secrets; too few servers
        with pytest.raises(DkgError, match="threshold of at least 2"):
            ReshareRecipient(group, 1, t, n, tpk.x_shares, tpk.t)
        with pytest.raises(DkgError, match="threshold of at least 2"):
            ReshareDealer(group, 1, secrets[1].x, t, n)
    recipient.receive(1, dealing)  # the control: from its author, taken
    recipient.receive_share(1, shares[1])
    with pytest.raises(DkgError, match="a second dealing"):
        recipient.receive(1, dealing)
    with pytest.raises(DkgError, match="a second share"):
        recipient.receive_share(1, shares[1])


def endorse(group, tpk, secrets, servers, previous, new, generation):
    """``servers`` of ``tpk`` sign ``new`` as the successor of ``previous``."""
    message = T.reshare_message(previous, new, generation)
    return T.combine_signatures(group, tpk, [T.partial_sign(group, secrets[i], message)
                                             for i in servers])


def test_clients_take_the_next_generation_signed_under_x_and_nothing_else(old):
    """A client holding the set-up's public key takes the new set's when ``t`` servers
    signed it under ``X`` as the successor of the key it holds, one generation later; then
    the next from the new set. It refuses the same generation again, an older one (which
    would bring a retired server back), a skipped one, a successor of another key, another
    deployment's key signed by its own servers, and a signature of another public key."""
    pp, tpk, secrets, _ = old
    group = pp.group
    first, first_secrets = new_deployment(group, tpk, *reshare_args(group, tpk, secrets))
    endorsement = endorse(group, tpk, secrets, (1, 2, 4), tpk, first, 1)
    assert T.accept_reshared(group, tpk, 0, first, 1, endorsement)
    assert not T.accept_reshared(group, tpk, 1, first, 1, endorsement)  # already held
    second, _ = new_deployment(group, first, *reshare_args(group, first, first_secrets))
    later = endorse(group, first, first_secrets, (3, 4, 5), first, second, 2)  # the new set
    assert T.accept_reshared(group, first, 1, second, 2, later)
    assert not T.accept_reshared(group, second, 2, first, 1, endorsement)  # rolled back
    assert not T.accept_reshared(group, tpk, 0, second, 1, endorsement)  # signed another
    assert not T.accept_reshared(group, tpk, 0, second, 2, later)  # skips generation 1
    skipping = endorse(group, tpk, secrets, (1, 2, 3), tpk, first, 2)  # names the held key
    assert not T.accept_reshared(group, tpk, 0, first, 2, skipping)  # but skips generation 1
    for generation in (0, 1 << 64):  # out of the u64, refused, not raised
        assert not T.accept_reshared(group, tpk, generation - 1, first, generation, skipping)
    stray = endorse(group, tpk, secrets, (1, 2, 3), first, second, 1)  # successor of first
    assert not T.accept_reshared(group, tpk, 0, second, 1, stray)
    assert T.accept_reshared(group, tpk, 0, second, 1, endorse(  # control: of the held key
        group, tpk, secrets, (1, 2, 3), tpk, second, 1))
    other, other_secrets = local_deployment(group, 3, 5, b"another deployment")
    foreign = endorse(group, other, other_secrets, (1, 2, 3), other, other, 1)
    assert T.verify_signature(group, other.X, T.reshare_message(other, other, 1), foreign)
    assert not T.accept_reshared(group, tpk, 0, other, 1, foreign)


def test_clients_refuse_a_signed_key_that_changes_the_deployment_or_its_shares(old):
    """Each of the client's checks alone, on keys the old servers really signed (so only
    that check can refuse them): another deployment id, MPK, ``W``, ``G`` or ``X``; public
    shares off the polynomial through the old key; fewer than ``2t - 1`` servers. The
    control: the honest new key, signed the same way, is taken."""
    pp, tpk, secrets, _ = old
    group = pp.group
    first, _ = new_deployment(group, tpk, *reshare_args(group, tpk, secrets))
    other, _ = local_deployment(group, 3, 5, b"another deployment")
    def swapped(name):
        shares = dict(public_shares(first, name))
        shares[1], shares[2] = shares[2], shares[1]
        return replace(first, **{f"{name}_shares": shares})

    bad = {
        "deployment": replace(first, deployment=b"another deployment"),
        "mpk": replace(first, mpk=other.mpk),
        "W": replace(first, W=other.W),
        "G": replace(first, G=other.G),
        "X": replace(first, X=other.X),
        **{f"{name} shares off the polynomial": swapped(name) for name in SECRETS},
        "threshold 1": replace(first, t=1),
        "4 servers at threshold 3": replace(first, n=4, **{
            f"{name}_shares": {j: public_shares(first, name)[j] for j in range(1, 5)}
            for name in SECRETS}),
    }
    for what, key in bad.items():
        signed = endorse(group, tpk, secrets, (1, 2, 3), tpk, key, 1)
        assert not T.accept_reshared(group, tpk, 0, key, 1, signed), what
    assert T.accept_reshared(group, tpk, 0, first, 1,
                             endorse(group, tpk, secrets, (1, 2, 3), tpk, first, 1))


def reshare_args(group, tpk, secrets):
    """An honest resharing of ``tpk``'s servers 1-4 to 3 of 5 (for :func:`new_deployment`)."""
    results, _ = reshare(group, tpk, secrets, (1, 2, 3, 4), 3, 5)
    return results, 3, 5


def test_a_member_list_signed_before_a_resharing_does_not_verify_after_it(old):
    """``X`` outlives a resharing, so a list of member keys signed under it must name the
    public key it goes with (an attack review: the old list, with a removed member's key,
    stayed valid for good and counted toward link quorums). Control: the new set's
    signature of its own list verifies."""
    pp, tpk, secrets, _ = old
    group = pp.group
    new, new_secrets = new_deployment(group, tpk, *reshare_args(group, tpk, secrets))
    keys = {i: bytes([i]) * 32 for i in range(1, 6)}
    before = T.combine_signatures(group, tpk, [
        T.partial_sign(group, secrets[i], T.members_message(tpk, keys)) for i in (1, 2, 3)])
    assert T.verify_signature(group, tpk.X, T.members_message(tpk, keys), before)
    assert not T.verify_signature(group, new.X, T.members_message(new, keys), before)
    after = T.combine_signatures(group, new, [
        T.partial_sign(group, new_secrets[i], T.members_message(new, keys)) for i in (2, 4, 5)])
    assert T.verify_signature(group, new.X, T.members_message(new, keys), after)
