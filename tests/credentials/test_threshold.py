"""The threshold key service's cryptography (docs/scheme.md, version 3), 3 of 5 servers:
dealer-free set-up (three key generations and the beta ceremony), key shares checked and
combined into version-2 keys, threshold signatures; and the attacks on it, each with a
control that shows the attack code works where it should.

Everything runs the real algorithms in one process: the servers' network part is not
built yet, so the messages a server would send are handed over directly.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.ceremony import (
    BetaState,
    BetaStep,
    CeremonyError,
    beta_step,
    check_beta_step,
    initial_beta_state,
    proof_challenge,
)
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import decompose, root_credential
from ibe_pubsub.credentials.dkg import (
    Complaint,
    Dealing,
    DkgError,
    Justification,
    Participant,
    qualified_dealers,
)
from ibe_pubsub.credentials.groups import G1, G2
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.server_keys import Ed25519Server
from ibe_pubsub.credentials.shamir import lagrange_at, lagrange_at_zero
from ibe_pubsub.evaluation.threshold_lab import local_deployment

t, n, EPOCH, DEPLOYMENT = 3, 5, 7, b"test-deployment"
EVENT = S.Event("quote-1", {"symbol": "IBM", "price": 131.5, "volume": 2000}, b"hello")


def broadcast(participants, sender, message):
    """Every participant takes the message (an authenticated, consistent broadcast); the
    answers it draws (justifications), by their authors."""
    answers = [p.receive(sender, message) for p in participants]
    return [a for a in answers if a is not None]


def run_dkg(group, cheat=None, answer=None):
    """One key generation among n servers, each phase after the one before: dealings and
    private shares, complaints, answers, results. ``cheat(dealer, shares)`` may alter the
    shares a dealer sends (a missing key: the share is never sent); ``answer(j)`` may
    replace a dealer's answer (None: it stays silent)."""
    participants = [Participant(group, i, t, n) for i in range(1, n + 1)]
    for p in participants:
        dealing, shares = p.dealing()
        if cheat is not None:
            shares = cheat(p.index, dict(shares))
        broadcast(participants, p.index, dealing)
        for q in participants:
            if q.index in shares:
                q.receive_share(p.index, shares[q.index])
    complaints = [(p.index, c) for p in participants for c in p.complaints()]
    answers = [a for sender, c in complaints for a in broadcast(participants, sender, c)]
    for a in answers:
        a = answer(a) if answer is not None else a
        if a is not None:
            broadcast(participants, a.dealer, a)
    return participants, [c for _, c in complaints]


def finished(participants):
    return [p.finish() for p in participants]


@pytest.fixture(scope="module")
def deployment():
    """Every server in this process (the key generations and the ceremony handed over
    directly): the public key, every server's secrets, a publisher's event."""
    group = load_group()
    tpk, secrets = local_deployment(group, t, n, DEPLOYMENT)
    pp = S.PublicParams(group, tpk.mpk, default_schema())
    publisher = [publisher_key(pp, tpk, secrets, c, (1, 2, 3)) for c in credentials(pp, "")]
    return pp, tpk, secrets, S.encrypt_and_sign(pp, publisher, EVENT)


def credentials(pp, subscription):
    parts = decompose(pp.schema, parse_predicate(pp.schema, subscription))
    return [c for cs in parts.values() for c in cs]


def publisher_key(pp, tpk, secrets, credential, servers):
    shares = [T.keyshare_publisher(pp, tpk, secrets[i], "pub", credential, EPOCH)
              for i in servers]
    assert all(T.verify_publisher_share(pp, tpk, s, "pub", credential, EPOCH) for s in shares)
    return T.combine_publisher_key(pp, tpk, shares)


def shares_of(pp, tpk, secrets, subscription, servers, identity="alice"):
    return [T.keyshare_subscriber(pp, tpk, secrets[i], identity, EPOCH,
                                  credentials(pp, subscription)) for i in servers]


def reads(pp, key, ciphertext) -> bool:
    try:
        return S.decrypt(pp, S.prepare_subscriber_key(pp, key), ciphertext) == EVENT
    except S.SchemeError:
        return False


def combine_anyway(pp, shares):
    """What an attacker does with shares the client code refuses: Lagrange weights of the
    indices given, whatever their number, applied to every component."""
    group = pp.group
    weights = lagrange_at_zero([s.index for s in shares], group.order)
    lam = [weights[s.index] for s in shares]

    def mix(parts):
        return group.multi_exp(parts, lam)

    first = shares[0].key
    return S.SubscriberKey(first.epoch, mix([s.key.D for s in shares]), tuple(
        replace(k, S1=mix([s.key.credentials[m].S1 for s in shares]),
                S2=mix([s.key.credentials[m].S2 for s in shares]),
                T=mix([s.key.credentials[m].T for s in shares]))
        for m, k in enumerate(first.credentials)))


def pooled(base, donor, attribute):
    """``base``'s key with its credential keys on ``attribute`` taken from ``donor``."""
    keep = tuple(k for k in base.credentials if k.credential.attribute != attribute)
    return replace(base, credentials=keep + donor.for_attribute(attribute))


# -- what must work ----------------------------------------------------------------------------

def test_keys_combined_from_any_three_servers_route_decrypt_and_sign(deployment):
    pp, tpk, secrets, ciphertext = deployment
    assert S.verify(pp, ciphertext)  # publisher keys combined from servers 1, 2, 3
    for servers in itertools.combinations(range(1, n + 1), t):
        subscription = 'symbol = "IBM" and price < 200'
        shares = shares_of(pp, tpk, secrets, subscription, servers)
        assert all(T.verify_subscriber_share(pp, tpk, s, "alice", EPOCH,
                                             credentials(pp, subscription)) for s in shares)
        key = T.combine_subscriber_key(pp, tpk, shares)
        assert reads(pp, key, ciphertext), servers
        assert S.route_test(pp, key.for_attribute("symbol")[0].token, ciphertext)
    publisher = [publisher_key(pp, tpk, secrets, c, (2, 4, 5)) for c in credentials(pp, "")]
    assert S.verify(pp, S.encrypt_and_sign(pp, publisher, EVENT))
    other = T.combine_subscriber_key(pp, tpk, shares_of(pp, tpk, secrets, "price > 500",
                                                         (1, 2, 3)))
    assert not reads(pp, other, ciphertext)
    assert not S.route_test(pp, other.for_attribute("price")[0].token, ciphertext)


def test_asking_again_gives_the_same_share_and_another_request_a_new_binding(deployment):
    pp, tpk, secrets, _ = deployment
    first, again = (shares_of(pp, tpk, secrets, 'symbol = "IBM"', (2,))[0] for _ in "ab")
    assert first == again
    other = shares_of(pp, tpk, secrets, 'symbol = "IBM" and price < 200', (2,))[0]
    assert other.Gamma != first.Gamma and other.key.D != first.key.D
    assert shares_of(pp, tpk, secrets, 'symbol = "IBM"', (2,), "bob")[0].key.D != first.key.D


def test_each_server_public_share_matches_its_secret_share():
    group = load_group()
    results = finished(run_dkg(group)[0])
    g_hat = group.generator(G2)
    for r in results:
        assert r.public_shares == results[0].public_shares and r.qualified == set(range(1, 6))
        assert g_hat ** r.share == r.public_shares[r.index]
    for chosen in ((1, 2, 3), (3, 4, 5)):
        weights = lagrange_at_zero(chosen, group.order)
        assert g_hat ** sum(weights[i] * results[i - 1].share for i in chosen) == \
            results[0].public_key


def test_threshold_signatures_combine_from_any_three_and_verify_against_one_key(deployment):
    pp, tpk, secrets, _ = deployment
    group, message = pp.group, b"schema v1"
    partials = {i: T.partial_sign(group, secrets[i], message) for i in range(1, n + 1)}
    assert all(T.verify_partial_signature(group, tpk, message, p) for p in partials.values())
    signatures = {T.combine_signatures(group, tpk, [partials[i] for i in chosen])
                  for chosen in itertools.combinations(range(1, n + 1), t)}
    assert len(signatures) == 1
    signature = signatures.pop()
    assert T.verify_signature(group, tpk.X, message, signature)
    assert not T.verify_signature(group, tpk.X, b"schema v2", signature)



#: The requester's own secret s; its V = ĝ^s is signed into its requests.
REQUESTER_SECRET = 0x5EC7E7


def binding(pp):
    return pp.group.exp_secret(pp.mpk.g_hat, REQUESTER_SECRET)


def view(pp, credential, seed, identity="alice"):
    """What the requester derives of its request for ``credential`` without building it."""
    return S.requester_view(pp, identity, credential, EPOCH, 2**40, seed, REQUESTER_SECRET)


def bound_secrets(pp, credential, sws, seed, identity="alice"):
    """The requester's SW'_j of its request for ``credential``: bound with s_c = s h_c."""
    return S.bind_request_secrets(pp, credential, EPOCH, sws,
                                  view(pp, credential, seed, identity).s_c)


def request_partials(pp, secrets, credential, seed, servers, identity="alice"):
    return [T.partial_sign_request(pp, secrets[i], identity, credential, EPOCH, 2**40, seed,
                                   binding(pp))[1] for i in servers]


def derive(pp, credential, seed, identity="alice"):
    return S.derive_connection_request(pp, identity, credential, EPOCH, 2**40, seed,
                                       binding(pp))


def test_members_sign_one_connection_request_built_from_the_requesters_seed(deployment):
    """Every member derives the same request from the seed; t partials combine into a
    signature peers check against X; the request opens for a covering credential only."""
    pp, tpk, secrets, _ = deployment
    group, anchor = pp.group, T.ThresholdServer(pp.group, tpk.X)
    requester, seed = Credential("symbol", "str", "IBM"), b"\x01" * S.REQUEST_SEED_BYTES
    request, sws = derive(pp, requester, seed)
    assert derive(pp, requester, seed) == (request, sws)
    # what a member answers, and the SWs the requester derives without building the request
    body, _ = T.partial_sign_request(pp, secrets[4], "alice", requester, EPOCH, 2**40, seed,
                                     binding(pp))
    assert codec.decode_request_body(group, body) == request
    assert view(pp, requester, seed).sws == sws
    assert view(pp, requester, seed, "bob").sws != sws
    # the client's spot check of a body members built: its binding and entry 0 are the seed's
    assert view(pp, requester, seed).matches(request)
    swapped = replace(request, entries=(request.entries[1], request.entries[0],
                                        *request.entries[2:]))
    for other, identity in ((derive(pp, requester, b"\x02" * 32)[0], "alice"),
                            (request, "bob"), (swapped, "alice")):
        assert not view(pp, requester, seed, identity).matches(other)
    other_seed, _ = derive(pp, requester, b"\x02" * 32)
    other_credential, _ = derive(pp, Credential("symbol", "str", "IBN"), seed)
    other_identity, _ = derive(pp, requester, seed, identity="bob")
    for other in (other_seed, other_credential, other_identity):  # no t, SW or padding shared
        assert not {bytes(e.U) for e in other.entries} & {bytes(e.U) for e in request.entries}
    signed = {T.signed_request(group, tpk, request,
                               request_partials(pp, secrets, requester, seed, chosen))
              for chosen in itertools.combinations(range(1, n + 1), t)}
    assert len(signed) == 1
    signed_one = signed.pop()
    S.check_connection_request(pp, signed_one, anchor, 0, {EPOCH})
    wire = codec.decode_request(group, codec.encode_request(signed_one))  # tag 22 inside
    assert wire == signed_one and codec.encode_request_body(wire)[0] == 22
    holder = T.combine_subscriber_key(pp, tpk, [T.keyshare_subscriber(
        pp, tpk, secrets[i], "bob", EPOCH, [Credential("symbol", "str", "IB")])
        for i in (1, 2, 3)]).credentials[0].token
    assert S.open_connection_request(pp, holder, replace(
        signed_one, binding=group.identity(S.G2))) is None  # an identity V binds nothing
    opening = S.open_connection_request(pp, holder, signed_one)
    bound = bound_secrets(pp, requester, sws, seed)
    assert opening is not None and opening.sw == bound[holder.position]
    # Each request of one seed carries its own V_c = V^h_c, none V itself: requests of one
    # enrolment share no bytes a peer could link them by; bound with V's s, none opens.
    assert len({bytes(V.binding) for V in (request, other_credential)} | {
        bytes(binding(pp))}) == 3
    assert S.bind_request_secrets(pp, requester, EPOCH, sws, REQUESTER_SECRET) != bound
    # A member knows the seed, so the unbound SWs: they prove nothing without the token.
    assert S.check_acceptance(bound, signed_one, S.acceptance_proof(
        opening.sw, signed_one, b"ctx"), b"ctx") == holder.position  # control
    for sw in sws:
        assert S.check_acceptance(bound, signed_one, S.acceptance_proof(
            sw, signed_one, b"ctx"), b"ctx") is None
    outsider = T.combine_subscriber_key(pp, tpk, [T.keyshare_subscriber(
        pp, tpk, secrets[i], "eve", EPOCH, [Credential("symbol", "str", "IC")])
        for i in (1, 2, 3)]).credentials[0].token
    assert S.open_connection_request(pp, outsider, signed_one) is None


def test_a_connection_request_without_t_members_signatures_is_refused(deployment):
    """What a peer refuses: t - 1 partials, partials of another request or of another
    identity's request from the same seed (16.8), a request changed after signing (its
    entries, or its binding V taken away or replaced), the
    single-server scheme's Ed25519 signature, and bytes that are no point. The control:
    the same request with t partials passes."""
    pp, tpk, secrets, _ = deployment
    group, anchor = pp.group, T.ThresholdServer(pp.group, tpk.X)
    requester, seed = Credential("price", "num", "0110"), b"\x03" * S.REQUEST_SEED_BYTES
    request, _ = derive(pp, requester, seed)
    good = T.signed_request(group, tpk, request,
                            request_partials(pp, secrets, requester, seed, (2, 4, 5)))
    S.check_connection_request(pp, good, anchor, 0, {EPOCH})  # control
    few = request_partials(pp, secrets, requester, seed, (1, 2))
    weights = lagrange_at_zero([1, 2], group.order)  # two, as if they were all
    two = replace(request, signature=bytes(group.multi_exp([p.sigma for p in few],
                                                           [weights[1], weights[2]])))
    mixed = T.signed_request(group, tpk, request, [
        *few, *request_partials(pp, secrets, Credential("price", "num", "0111"), seed, [3])])
    pooled = T.signed_request(group, tpk, request, [
        *few, *request_partials(pp, secrets, requester, seed, [3], identity="bob")])
    probing = replace(good, entries=(*good.entries[:-1], good.entries[0]))
    unbound = replace(good, binding=None)
    rebound = replace(good, binding=group.exp_secret(pp.mpk.g_hat, 7))
    server = Ed25519PrivateKey.generate()
    ed25519 = replace(request, signature=server.sign(codec.encode_request_body(request)))
    junk = [replace(good, signature=s) for s in (b"", b"\x00" * 48, good.signature[:-1],
                                                  bytes(group.identity(G1)))]
    for bad in (two, mixed, pooled, probing, unbound, rebound, ed25519, *junk):
        with pytest.raises(S.RequestRejected, match="signature"):
            S.check_connection_request(pp, bad, anchor, 0, {EPOCH})
    with pytest.raises(S.RequestRejected, match="signature"):  # and the other way round
        S.check_connection_request(pp, good, Ed25519Server(server.public_key()
                                                           .public_bytes_raw()), 0, {EPOCH})
    with pytest.raises(S.SchemeError, match="32 bytes"):
        derive(pp, requester, seed[:-1])



def test_one_servers_partial_signatures_are_checked_at_once(deployment):
    """The batch check a client runs on one member's request signatures: it passes for
    the member's own signatures (the control) and fails if any one is of another message,
    another member's, or under another index."""
    pp, tpk, secrets, _ = deployment
    group = pp.group
    messages = [b"body %d" % k for k in range(5)]
    own = [T.partial_sign(group, secrets[2], m) for m in messages]
    assert T.verify_partial_signatures(group, tpk, messages, own)
    other_message = [*own[:3], T.partial_sign(group, secrets[2], b"another body"), own[4]]
    other_member = [*own[:4], replace(T.partial_sign(group, secrets[3], messages[4]), index=2)]
    mixed = [*own[:4], T.partial_sign(group, secrets[3], messages[4])]
    for bad in (other_message, other_member, mixed, own[:4]):
        assert not T.verify_partial_signatures(group, tpk, messages, bad)


# -- attacks by a subscriber -------------------------------------------------------------------

def test_the_shares_of_two_servers_do_not_decrypt(deployment):
    pp, tpk, secrets, ciphertext = deployment
    subscription = 'symbol = "IBM"'
    with pytest.raises(T.ThresholdError):
        T.combine_subscriber_key(pp, tpk, shares_of(pp, tpk, secrets, subscription, (1, 2)))
    for pair in itertools.combinations(range(1, n + 1), 2):
        assert not reads(pp, combine_anyway(pp, shares_of(pp, tpk, secrets, subscription,
                                                          pair)), ciphertext)
    # Control: the attacker's own combination, given a third share, reads.
    assert reads(pp, combine_anyway(pp, shares_of(pp, tpk, secrets, subscription, (1, 2, 5))),
                 ciphertext)


def test_parts_of_one_key_combined_over_two_server_sets_do_not_mix(deployment):
    pp, tpk, secrets, ciphertext = deployment
    subscription = 'symbol = "IBM"'
    a = T.combine_subscriber_key(pp, tpk, shares_of(pp, tpk, secrets, subscription, (1, 2, 3)))
    b = T.combine_subscriber_key(pp, tpk, shares_of(pp, tpk, secrets, subscription, (3, 4, 5)))
    assert reads(pp, a, ciphertext) and reads(pp, b, ciphertext)
    assert not reads(pp, replace(a, D=b.D), ciphertext)
    assert not reads(pp, pooled(a, b, "price"), ciphertext)
    assert reads(pp, pooled(a, a, "price"), ciphertext)  # control: the pooling itself works


def test_two_subscribers_cannot_pool_their_keys(deployment):
    """Alice's symbol matches, not her price; Bob's price, not his symbol. Each reads
    nothing; their keys pooled read nothing either."""
    pp, tpk, secrets, ciphertext = deployment
    servers = (1, 3, 4)
    alice = T.combine_subscriber_key(pp, tpk, shares_of(
        pp, tpk, secrets, 'symbol = "IBM" and price > 500', servers, "alice"))
    bob = T.combine_subscriber_key(pp, tpk, shares_of(
        pp, tpk, secrets, 'symbol = "MSFT" and price < 200', servers, "bob"))
    assert not reads(pp, alice, ciphertext) and not reads(pp, bob, ciphertext)
    assert not reads(pp, pooled(alice, bob, "price"), ciphertext)
    assert not reads(pp, pooled(bob, alice, "symbol"), ciphertext)
    # Control: the same pooling of one identity's keys from two requests bound by one
    # gamma_s (the same request twice) reads.
    full = T.combine_subscriber_key(pp, tpk, shares_of(
        pp, tpk, secrets, 'symbol = "IBM" and price < 200', servers, "alice"))
    assert reads(pp, pooled(full, full, "price"), ciphertext)


def test_identities_below_t_cannot_pool_their_shares(deployment):
    """The flaw of docs/scheme.md 16.8: alice gets shares at servers 1 and 2 only, bob at
    server 3 only (each allowed at fewer than t), both for the same credentials. Their
    three shares combined read nothing, their routing tokens route nothing (a review found
    those pooled too, before ``T_i`` was bound), and publisher shares pooled likewise sign
    nothing that verifies. Control: the same pooling against servers without the sharing
    of zero (rho_i = 0, the design before the fix) reads, routes and signs."""
    pp, tpk, secrets, ciphertext = deployment
    subscription = 'symbol = "IBM" and price < 200'
    credential = credentials(pp, "")[0]

    def pool(server_secrets):
        shares = (shares_of(pp, tpk, server_secrets, subscription, (1, 2), "alice")
                  + shares_of(pp, tpk, server_secrets, subscription, (3,), "bob"))
        publisher = [T.keyshare_publisher(pp, tpk, server_secrets[i], who, c, EPOCH)
                     for c in credentials(pp, "") for i, who in
                     ((1, "alice"), (2, "alice"), (3, "bob"))]
        keys = [T.combine_publisher_key(pp, tpk, publisher[k:k + 3])
                for k in range(0, len(publisher), 3)]
        pooled = T.combine_subscriber_key(pp, tpk, shares)
        return (reads(pp, pooled, ciphertext),
                S.route_test(pp, pooled.for_attribute("symbol")[0].token, ciphertext),
                S.verify(pp, S.encrypt_and_sign(pp, keys, EVENT)))

    assert pool(secrets) == (False, False, False)
    without_rho = {i: replace(s, rho=0) for i, s in secrets.items()}
    assert pool(without_rho) == (True, True, True)  # control: the attack, unfixed design
    # Each share verifies for its own identity, not for the other's.
    alice = shares_of(pp, tpk, secrets, subscription, (1,), "alice")[0]
    request = (EPOCH, credentials(pp, subscription))
    assert T.verify_subscriber_share(pp, tpk, alice, "alice", *request)
    assert not T.verify_subscriber_share(pp, tpk, alice, "bob", *request)
    share = T.keyshare_publisher(pp, tpk, secrets[1], "alice", credential, EPOCH)
    assert not T.verify_publisher_share(pp, tpk, share, "bob", credential, EPOCH)


def test_the_sharing_of_zero_shares_zero_and_refuses_a_dealer_that_shares_more():
    """rho: every dealing's C_0 is the identity, any t shares interpolate to 0, and the
    public shares to the identity. A dealer whose C_0 is not the identity (it would share
    a secret of its own) is disqualified; public shares through another point are
    refused."""
    group = load_group()
    participants = [Participant(group, i, t, n, zero=True) for i in range(1, n + 1)]
    for p in participants:
        dealing, shares = p.dealing()
        assert dealing.commitments[0] == group.identity(G2)
        broadcast(participants, p.index, dealing)
        for q in participants:
            q.receive_share(p.index, shares[q.index])
    results = finished(participants)
    assert results[0].public_key == group.identity(G2)
    for chosen in ((1, 2, 3), (2, 4, 5)):
        weights = lagrange_at_zero(chosen, group.order)
        assert sum(weights[i] * results[i - 1].share for i in chosen) % group.order == 0
    T.check_public_shares(group, t, n, group.identity(G2), results[0].public_shares, "rho",
                          zero=True)
    honest = Participant(group, 1, t, n).dealing()[0]  # a C_0 that is not the identity
    dealings = {p.index: p.dealing()[0] for p in participants}
    assert qualified_dealers(group, {**dealings, 1: honest}, t, n, [], [], zero=True) == \
        {2, 3, 4, 5}
    assert qualified_dealers(group, dealings, t, n, [], [], zero=True) == set(range(1, 6))
    g_hat = group.generator(G2)
    delta = finished(run_dkg(group)[0])[0]
    for key, shares in ((group.identity(G2), delta.public_shares),
                        (g_hat, results[0].public_shares)):
        with pytest.raises(T.ThresholdError):
            T.check_public_shares(group, t, n, key, shares, "rho", zero=True)


def draft_keyshare_subscriber(pp, tpk, secrets, identity, epoch, creds):
    """The draft's derivation, ``gamma_s_i = PRF_i(identity, epoch)`` and ``gamma_i =
    PRF_i(identity, epoch, credential)``: one binding per identity and epoch."""
    group, g2, g_hat = pp.group, tpk.mpk.g2, tpk.mpk.g_hat
    gamma_s = T.prf_scalar(group, secrets.prf_key, identity.encode(), epoch.to_bytes(8, "big"))
    keys = []
    for c in creds:
        name = S.identity_string(c.attribute, S.SUB, epoch, c)
        gamma = T.prf_scalar(group, secrets.prf_key, identity.encode(), name)
        F = pp.F(name)
        keys.append(S.SubscriberCredentialKey(
            c, epoch, group.exp_secret(g2, gamma_s) * group.exp_secret(F, gamma),
            group.exp_secret(g_hat, gamma), group.exp_secret(F, secrets.phi)))
    D = group.exp_secret(tpk.G, gamma_s) * group.exp_secret(g2, secrets.delta)
    return T.SubscriberKeyShare(secrets.index, S.SubscriberKey(epoch, D, tuple(keys)),
                                group.exp_secret(g_hat, gamma_s))


def test_keys_issued_under_two_policies_in_one_epoch_do_not_combine(deployment):
    """The design flaw this implementation fixes: an identity whose policy changes within
    an epoch (symbol IBM with prices above 500, then symbol MSFT under 200) holds keys of
    both. Under the draft's per-identity binding they pool into IBM under 200, which
    neither policy allowed; under the per-issuance binding they do not."""
    pp, tpk, secrets, ciphertext = deployment
    servers = (2, 3, 5)
    before, after = 'symbol = "IBM" and price > 500', 'symbol = "MSFT" and price < 200'

    def draft(subscription):
        return T.combine_subscriber_key(pp, tpk, [draft_keyshare_subscriber(
            pp, tpk, secrets[i], "alice", EPOCH, credentials(pp, subscription))
            for i in servers])

    old, new = draft(before), draft(after)
    assert not reads(pp, old, ciphertext) and not reads(pp, new, ciphertext)
    assert reads(pp, pooled(old, new, "price"), ciphertext)  # the attack, on the draft
    old, new = (T.combine_subscriber_key(pp, tpk, shares_of(pp, tpk, secrets, s, servers))
                for s in (before, after))
    assert not reads(pp, pooled(old, new, "price"), ciphertext)
    assert not reads(pp, pooled(new, old, "symbol"), ciphertext)


# -- attacks by a server -----------------------------------------------------------------------

def test_a_bad_share_is_detected_and_a_replacement_server_used(deployment):
    pp, tpk, secrets, ciphertext = deployment
    subscription = 'symbol = "IBM"'
    good = {s.index: s for s in shares_of(pp, tpk, secrets, subscription, range(1, n + 1))}
    g1 = pp.group.generator(G1)
    bad = good[2]
    first, rest = bad.key.credentials[0], bad.key.credentials[1:]

    def with_first(**changes):
        return replace(bad, key=replace(bad.key, credentials=(replace(first, **changes),
                                                              *rest)))

    forged = [
        replace(bad, key=replace(bad.key, D=bad.key.D * g1)),
        with_first(S1=first.S1 * g1),
        with_first(T=good[3].key.credentials[0].T),
        replace(good[3], index=2),  # another server's share under this server's number
    ]
    request = ("alice", EPOCH, credentials(pp, subscription))
    assert T.verify_subscriber_share(pp, tpk, bad, *request)
    # A wrong check value alone is refused too (the client cannot tell which part lies).
    assert not T.verify_subscriber_share(pp, tpk, replace(bad, Gamma=good[3].Gamma), *request)
    for share in forged:
        assert not T.verify_subscriber_share(pp, tpk, share, *request)
        assert not reads(pp, T.combine_subscriber_key(pp, tpk, [good[1], share, good[4]]),
                         ciphertext)
    # Routed around: server 5 instead of server 2.
    assert reads(pp, T.combine_subscriber_key(pp, tpk, [good[1], good[4], good[5]]),
                 ciphertext)
    credential = credentials(pp, "")[0]
    share = T.keyshare_publisher(pp, tpk, secrets[2], "pub", credential, EPOCH)
    assert T.verify_publisher_share(pp, tpk, share, "pub", credential, EPOCH)
    assert not T.verify_publisher_share(pp, tpk, replace(share, key=replace(
        share.key, P1=share.key.P1 * g1)), "pub", credential, EPOCH)
    assert not T.verify_publisher_share(pp, tpk, replace(share, index=4), "pub", credential,
                                        EPOCH)
    # A valid share, for another request or another identity, is not taken for this one.
    assert not T.verify_publisher_share(pp, tpk, share, "pub", credential, EPOCH + 1)
    assert not T.verify_publisher_share(pp, tpk, share, "bob", credential, EPOCH)
    other = shares_of(pp, tpk, secrets, 'symbol = "IBM" and price < 200', (2,))[0]
    assert T.verify_subscriber_share(pp, tpk, other, "alice", EPOCH,
                                     credentials(pp, 'symbol = "IBM" and price < 200'))
    assert not T.verify_subscriber_share(pp, tpk, other, *request)
    assert not T.verify_subscriber_share(pp, tpk, bad, "bob", *request[1:])


def test_a_bad_partial_signature_is_detected(deployment):
    pp, tpk, secrets, _ = deployment
    group, message = pp.group, b"root certificate"
    partials = [T.partial_sign(group, secrets[i], message) for i in (1, 2, 3)]
    wrong = [T.partial_sign(group, secrets[2], b"another message"),
             replace(partials[1], index=4),
             replace(partials[1], sigma=partials[1].sigma * group.generator(G1))]
    for partial in wrong:
        assert not T.verify_partial_signature(group, tpk, message, partial)
        combined = T.combine_signatures(group, tpk, [partials[0], partial, partials[2]])
        assert not T.verify_signature(group, tpk.X, message, combined)
    with pytest.raises(T.ThresholdError):
        T.combine_signatures(group, tpk, partials[:2])
    weights = lagrange_at_zero([1, 2], group.order)
    two = group.multi_exp([p.sigma for p in partials[:2]], [weights[1], weights[2]])
    assert not T.verify_signature(group, tpk.X, message, two)
    assert T.verify_signature(group, tpk.X, message,
                              T.combine_signatures(group, tpk, partials))  # control


def secret_of(group, results, chosen):
    """ĝ^(the secret) from the shares of ``chosen``, to compare with the public key."""
    weights = lagrange_at_zero(chosen, group.order)
    return group.generator(G2) ** sum(weights[i] * results[i - 1].share for i in chosen)


def test_a_dealer_that_sends_a_bad_or_no_share_must_reveal_a_good_one_or_is_disqualified():
    group = load_group()

    def wrong_to_4_none_to_5(dealer, shares):
        if dealer == 2:
            shares[4] = (shares[4] + 1) % group.order
            del shares[5]
        return shares

    # Both complaints answered with the right shares: everyone finishes, dealer 2 stays.
    participants, complaints = run_dkg(group, wrong_to_4_none_to_5)
    assert complaints == [Complaint(4, 2), Complaint(5, 2)]
    results = finished(participants)
    assert all(r.qualified == set(range(1, 6)) for r in results)
    assert secret_of(group, results, (1, 4, 5)) == secret_of(group, results, (2, 3, 5)) == \
        results[0].public_key
    # The dealer answers with a wrong share, or stays silent: disqualified by everyone,
    # and the others' shares still add up to the public key.
    for lie in (lambda a: replace(a, share=a.share + 1), lambda a: None):
        participants, _ = run_dkg(group, wrong_to_4_none_to_5, lie)
        results = finished(participants)
        assert all(r.qualified == {1, 3, 4, 5} for r in results)
        assert secret_of(group, results, (1, 4, 5)) == results[0].public_key


def test_an_answer_seen_twice_counts_once_and_two_different_answers_disqualify():
    """A transport that repeats an answer to some servers must not make them disagree (the
    repeated answer used to disqualify its dealer there only); a dealer answering one
    complaint with two different shares is out for everyone."""
    group = load_group()
    participants = [Participant(group, i, t, n) for i in range(1, n + 1)]
    dealings = {}
    for p in participants:
        dealing, shares = p.dealing()
        dealings[p.index] = dealing
        if p.index == 2:
            true_share = shares[4]
    complaint = Complaint(4, 2)
    answer = participants[1].receive(4, complaint)
    assert answer == Justification(2, 4, true_share)
    wrong = replace(answer, share=answer.share + 1)
    for seen, kept in (([answer], True), ([answer, answer], True), ([answer, wrong], False),
                       ([wrong], False)):
        qualified = qualified_dealers(group, dealings, t, n, [complaint], seen)
        assert (2 in qualified) is kept, seen
        assert qualified - {2} == {1, 3, 4, 5}


def test_messages_in_another_servers_name_are_refused_and_stray_answers_ignored():
    """A corrupt server 3 complains in server 1's name (the dealers would reveal server 1's
    shares: with two such names and its own, it would hold t shares of the secret), names
    a non-member or asks for f(0), and posts an unasked-for wrong answer naming server 1."""
    group = load_group()
    participants, _ = run_dkg(group)
    honest = participants[0]
    for forged in (Complaint(1, 2), Dealing(1, ()), Justification(2, 1, 5)):
        with pytest.raises(DkgError, match="in the name of"):
            honest.receive(3, forged)
    for outsider in (Complaint(0, 2), Complaint(6, 2)):
        with pytest.raises(DkgError, match="not a server"):
            honest.receive(outsider.accuser, outsider)
    with pytest.raises(DkgError, match="not a server"):
        honest.receive(3, Complaint(3, 0))  # a dealer 0 would reveal f(0)
    # A wrong answer nobody asked for disqualifies its dealer, for everyone alike; every
    # server still finishes, on the same key.
    for p in participants:
        p.receive(4, Justification(4, 1, 12345))
    results = finished(participants)
    assert all(r.qualified == {1, 2, 3, 5} for r in results)
    assert secret_of(group, results, (1, 2, 3)) == secret_of(group, results, (2, 4, 5)) == \
        results[0].public_key
    # Control: a complaint in its own name is answered, with the share it asked about.
    answer = participants[1].receive(3, Complaint(3, 2))
    assert answer is not None and answer.accuser == 3


def test_malformed_dealings_are_disqualified_and_too_few_dealers_stop_the_generation():
    group = load_group()
    participants = [Participant(group, i, t, n) for i in range(1, n + 1)]
    dealings = {p.index: p.dealing()[0] for p in participants}
    kept = {1: replace(dealings[1], commitments=dealings[1].commitments[:-1]),
            2: replace(dealings[2], commitments=(group.identity(G2),
                                                 *dealings[2].commitments[1:])),
            4: dealings[4], 5: dealings[5]}
    assert qualified_dealers(group, kept, t, n, [], []) == {4, 5}
    with pytest.raises(DkgError, match="a second dealing"):
        broadcast(participants, 3, dealings[3]) + broadcast(participants, 3, dealings[3])
    with pytest.raises(DkgError, match="fewer than t"):
        participants[4].finish()  # only dealer 3's dealing came


def test_fewer_than_2t_minus_1_servers_are_refused():
    """With n = 2t - 2, t - 1 corrupt dealers could commit to a C_0 they do not know the
    logarithm of and still hand every honest server a valid share, so as to choose the
    public key; n >= 2t - 1 leaves t honest shares that pin each polynomial down."""
    group = load_group()
    with pytest.raises(DkgError, match="2t - 1"):
        Participant(group, 1, 3, 4)
    assert Participant(group, 1, 3, 5).n == 5


def test_the_last_server_of_the_ceremony_cannot_choose_beta(deployment):
    """The rushing attack: the last server replaces the state with ``(g2^z, g2^(1/z),
    ĝ^z)`` for a ``z`` it knows, which would give it beta = z. The pairings hold for that
    state; only the proof of knowledge (over the previous ``hd``) stops it."""
    pp = deployment[0]
    group, g_hat = pp.group, pp.group.generator(G2)
    g2 = T.derive_g2(group, DEPLOYMENT)
    state = initial_beta_state(g2, g_hat)
    for server in (1, 2):
        state = check_beta_step(group, DEPLOYMENT, g2, state,
                                beta_step(group, DEPLOYMENT, server, state), server)
    q, z = group.order, group.random_scalar()
    chosen = BetaState(g2 ** z, g2 ** pow(z, -1, q), g_hat ** z)
    assert group.pair(chosen.W, g_hat) == group.pair(g2, chosen.hd)
    assert group.pair(chosen.G, chosen.hd) == group.pair(g2, g_hat)
    # It knows z = log_ĝ(hd), not log of hd to the previous hd's base: a Schnorr proof
    # with z, committed over either base, fails.
    for base in (state.hd, g_hat):
        r = group.random_scalar()
        R = base ** r
        c = proof_challenge(group, DEPLOYMENT, 3, state, chosen, R)
        with pytest.raises(CeremonyError):
            check_beta_step(group, DEPLOYMENT, g2, state,
                            BetaStep(3, chosen, R, (r + c * z) % q), 3)
    honest = beta_step(group, DEPLOYMENT, 3, state)
    assert check_beta_step(group, DEPLOYMENT, g2, state, honest, 3) == honest.state  # control
    # Another server's or another deployment's proof does not carry over.
    with pytest.raises(CeremonyError):
        check_beta_step(group, DEPLOYMENT, g2, state, replace(honest, server=4), 4)
    with pytest.raises(CeremonyError, match="expected the step of server 4"):
        check_beta_step(group, DEPLOYMENT, g2, state, honest, 4)
    with pytest.raises(CeremonyError):
        check_beta_step(group, b"another deployment", g2, state, honest, 3)
    # A W or G that does not match hd, with a valid proof for hd, is refused.
    b, r = group.random_scalar(), group.random_scalar()
    for skewed in (BetaState(state.W ** b * g2, state.G ** pow(b, -1, q), state.hd ** b),
                   BetaState(state.W ** b, state.G ** b, state.hd ** b)):
        R = state.hd ** r
        c = proof_challenge(group, DEPLOYMENT, 3, state, skewed, R)
        step = BetaStep(3, skewed, R, (r + c * b) % q)
        with pytest.raises(CeremonyError, match="do not match"):
            check_beta_step(group, DEPLOYMENT, g2, state, step, 3)



def test_public_shares_off_one_polynomial_are_refused(deployment):
    """A transcript whose public shares do not interpolate to the public key (a server's
    published share altered, or the key) is refused when the public key is put together."""
    pp, tpk, _, _ = deployment
    group = pp.group
    g_hat = group.generator(G2)
    state = BetaState(tpk.W, tpk.G, tpk.mpk.hd)
    delta, phi, x = (finished(run_dkg(group)[0])[0] for _ in "dpx")

    def assemble(delta_key, delta_shares):
        return T.assemble_public_key(group, DEPLOYMENT, t, n, state, delta_key, delta_shares,
                                     phi.public_key, phi.public_shares, x.public_key,
                                     x.public_shares, tpk.rho_shares)

    assert assemble(delta.public_key, delta.public_shares).t == t  # control
    for key, shares in ((delta.public_key * g_hat, delta.public_shares),
                        (delta.public_key, {**delta.public_shares,
                                            4: delta.public_shares[4] * g_hat}),
                        (delta.public_key, {**delta.public_shares,
                                            1: delta.public_shares[1] * g_hat}),
                        (delta.public_key, {i: delta.public_shares[i] for i in (1, 2, 3, 4)})):
        with pytest.raises(T.ThresholdError):
            assemble(key, shares)


def test_the_encoded_public_key_decodes_to_itself_and_tampering_is_refused(deployment):
    """Tag 18: what clients read from a deployment's threshold.json. Every public share,
    ``W`` and ``G``, and the label (which fixes ``g2``) are checked when decoding."""
    pp, tpk, _, _ = deployment
    group, g_hat = pp.group, pp.group.generator(G2)
    assert T.decode_public_key(group, T.encode_public_key(tpk)) == tpk  # control
    for tampered in (replace(tpk, phi_shares={**tpk.phi_shares, 5: tpk.phi_shares[5] * g_hat}),
                     replace(tpk, rho_shares={**tpk.rho_shares, 2: tpk.rho_shares[2] * g_hat}),
                     replace(tpk, delta_shares={**tpk.delta_shares,
                                                2: tpk.delta_shares[2] * g_hat}),
                     replace(tpk, x_shares={**tpk.x_shares, 4: tpk.x_shares[4] * g_hat}),
                     replace(tpk, X=tpk.X * g_hat),
                     replace(tpk, W=tpk.W * tpk.mpk.g),
                     replace(tpk, G=tpk.G * tpk.mpk.g),
                     replace(tpk, deployment=b"another deployment")):
        with pytest.raises(T.CodecError):
            T.decode_public_key(group, T.encode_public_key(tampered))
    with pytest.raises(T.CodecError, match="trailing"):
        T.decode_public_key(group, T.encode_public_key(tpk) + b"\0")


def test_a_roots_token_combines_from_any_three_servers_and_opens_entry_zero(deployment):
    """A root's whole-domain token issued alone: any 3 servers' shares combine into one
    token, which opens entry 0 of a request as version 2's root token does; each share is
    checked against its server's public shares, and 2 shares, or the shares of two
    identities, give no token (16.8)."""
    pp, tpk, secrets, _ = deployment
    group = pp.group
    root = root_credential(pp.schema.attribute("symbol"))

    def shares(identity, servers, epoch=EPOCH):
        return [T.keyshare_token(pp, tpk, secrets[i], identity, epoch, root) for i in servers]

    tokens = {T.combine_token(pp, tpk, shares("root", chosen))
              for chosen in itertools.combinations(range(1, n + 1), t)}
    assert len(tokens) == 1
    token = tokens.pop()
    requester, seed = Credential("symbol", "str", "IBM"), b"\x03" * S.REQUEST_SEED_BYTES
    request, sws = derive(pp, requester, seed)
    request = T.signed_request(group, tpk, request,
                               request_partials(pp, secrets, requester, seed, (1, 2, 3)))
    opening = S.open_connection_request(pp, token, request)
    bound = bound_secrets(pp, requester, sws, seed)
    assert opening is not None and opening.sw == bound[0]
    one = shares("root", [2])[0]
    assert T.verify_token_share(pp, tpk, one, "root", EPOCH, root)
    assert T.decode_token_share(group, T.encode_token_share(one)) == one
    for identity, epoch, credential, share in (
            ("other", EPOCH, root, one), ("root", EPOCH + 1, root, one),
            ("root", EPOCH, Credential("symbol", "str", "I"), one),
            ("root", EPOCH, root, replace(one, index=3)),
            ("root", EPOCH, root, replace(one, token=replace(one.token,
                                                              T=one.token.T * one.token.T)))):
        assert not T.verify_token_share(pp, tpk, share, identity, epoch, credential)
    for junk in (b"", T.encode_token_share(one)[:-1], T.encode_token_share(one) + b"\x00"):
        with pytest.raises(codec.CodecError):
            T.decode_token_share(group, junk)
    two = shares("root", (1, 2))
    weights = lagrange_at_zero([1, 2], group.order)
    forged = group.multi_exp([s.token.T for s in two], [weights[1], weights[2]])
    assert forged != token.T
    pooled = shares("root", (1, 2)) + shares("mallory", (3,))
    assert T.combine_token(pp, tpk, pooled).T != token.T


def test_t_partial_signatures_give_every_members_so_a_quorum_signs_with_its_own_keys(
        deployment):
    """Why a peer-link certificate carries each member's own Ed25519 signature and not
    partial signatures of ``x``: the shares lie on one polynomial, so ``t`` partials give
    any other member's by interpolation in the exponent, and a "quorum" of them shows no
    more than ``t`` (an attack review found this in the first version). Member keys are
    independent: ``t`` of them sign nothing for a fourth."""
    pp, _, secrets, _ = deployment
    group, message = pp.group, b"a link key, binding and expiry"
    partials = {i: T.partial_sign(group, secrets[i], message).sigma for i in (1, 2, 3)}
    weights = lagrange_at(partials, 4, group.order)
    forged = group.multi_exp(list(partials.values()), [weights[i] for i in partials])
    assert forged == T.partial_sign(group, secrets[4], message).sigma  # the attack
    keys = {i: Ed25519PrivateKey.generate() for i in range(1, n + 1)}
    public = {i: k.public_key().public_bytes_raw() for i, k in keys.items()}
    signed = {i: keys[i].sign(message) for i in (1, 2, 3)}
    quorum = T.link_quorum(t, n)
    assert quorum == 4
    assert not T.verify_quorum_signature(public, quorum, message,
                                         T.encode_quorum_signature(signed))
    signed[4] = keys[4].sign(message)
    assert T.verify_quorum_signature(public, quorum, message, T.encode_quorum_signature(signed))
    assert not T.verify_quorum_signature(public, quorum, b"another message",
                                         T.encode_quorum_signature(signed))


def test_a_malformed_quorum_signature_is_refused_not_raised():
    """The quorum signature's decoding (tag 24, no group element): every spelling but the
    one ``encode_quorum_signature`` writes is refused, and the honest one passes (the
    control)."""
    keys = {i: Ed25519PrivateKey.generate() for i in (1, 2)}
    public = {i: k.public_key().public_bytes_raw() for i, k in keys.items()}
    message = b"a link key, binding and expiry"
    honest = T.encode_quorum_signature({i: k.sign(message) for i, k in keys.items()})
    assert T.verify_quorum_signature(public, 2, message, honest)
    first, second = honest[3:68], honest[68:]  # index byte and signature, each signer
    for spelling in (honest[:-1], honest + b"\0", bytes([honest[0] + 1]) + honest[1:],
                     honest[:2] + b"\x03" + first + second,  # a count beyond the entries
                     honest[:3] + second + first,  # descending: the order is the check
                     honest[:3] + first + first, b"", honest[:2]):
        assert not T.verify_quorum_signature(public, 2, message, spelling)
