"""Resharing (docs/scheme.md, section 16.9): new shares of a deployment's secrets for a new
set of servers (another threshold, members removed or added) with the same public keys,
so that peers keep every key, certificate and pinned value they hold. Sans-I/O, like
:mod:`credentials.dkg`, whose dealings, complaints and answers it reuses.

The old servers' shares ``s_i`` lie on a polynomial ``f`` of degree ``t - 1`` with
``f(0) = s``. Each old server ``i`` deals its own share again, to the ``n'`` new servers:
a polynomial ``f_i`` of degree ``t' - 1`` with ``f_i(0) = s_i``, the commitments
``C_ik = ĝ^(a_ik)`` broadcast and ``f_i(j)`` sent to new server ``j`` privately. Every new
server checks ``C_i0`` against the old public share ``ĝ^(s_i)`` it already holds, so a
dealer can deal nothing but its share; complaints and answers are the key generation's.
Of the dealers that qualify, the ``t`` with the lowest numbers form ``Q`` (the same at
every new server: it follows from the broadcast alone), and new server ``j`` keeps

    s'_j = sum_{i in Q} lambda_i f_i(j)      (lambda_i: Lagrange weights at 0 over Q)

which lies on ``g = sum_{i in Q} lambda_i f_i``, of degree ``t' - 1``, with
``g(0) = sum lambda_i s_i = f(0) = s``: the same secret, which nobody forms. The new public
shares ``ĝ^(s'_j) = prod_{i in Q} (prod_k C_ik^(j^k))^lambda_i`` come from the broadcast.

**What it needs**: ``t`` old servers that deal honestly (the old threshold), and, as the
key generation, private authenticated channels and one consistent broadcast. **What it
gives**: old and new shares lie on different polynomials, so no mix of them combines
(fewer than ``t'`` new shares, topped up with old ones, give nothing). The old shares
themselves stay as good as before until deleted: a removed server is out of the
deployment only once the old servers it could collude with have deleted theirs (fewer
than ``t`` old shares kept give nothing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ibe_pubsub.credentials.dkg import (
    Complaint,
    Dealing,
    DkgError,
    Justification,
    answered_dealers,
    deal,
    share_is_valid,
    shares_from,
)
from ibe_pubsub.credentials.groups import G2, Element, PairingGroup
from ibe_pubsub.credentials.shamir import evaluate, lagrange_at_zero, random_polynomial
from ibe_pubsub.credentials.threshold import MAX_SERVERS, allowed_set


def _check_new_set(t: int, n: int) -> None:
    """As the set-up's plan (:func:`threshold.allowed_set`)."""
    if not allowed_set(t, n):
        raise DkgError(f"a new set needs a threshold of at least 2 (at 1 each server would "
                       f"hold the secrets) and 2t - 1 to {MAX_SERVERS} servers, got t={t}, "
                       f"n={n}")


@dataclass(frozen=True)
class ReshareResult:
    """A new server's outcome: its share ``s'_index``, every new server's public share, and
    the old servers whose dealings it is made of."""

    index: int
    share: int
    public_shares: Mapping[int, Element]
    dealers: frozenset[int]


class ReshareDealer:
    """Old server ``index`` dealing its ``share`` to the ``n`` servers of a new set with
    threshold ``t`` (send :meth:`dealing`; give :meth:`answer` every complaint of the
    broadcast, with its sender, and broadcast what it returns)."""

    def __init__(self, group: PairingGroup, index: int, share: int, t: int, n: int) -> None:
        _check_new_set(t, n)
        if index < 1:
            raise DkgError(f"old server numbers start at 1, got {index}")
        self.group, self.index, self.n = group, index, n
        self._polynomial = (share % group.order, *random_polynomial(group.random_scalar,
                                                                    t - 1)[1:])
        self._answered: set[int] = set()

    def dealing(self) -> tuple[Dealing, dict[int, int]]:
        """The broadcast commitments and the private share of each new server."""
        return deal(self.group, self.index, self._polynomial, self.n)

    def answer(self, sender: int, complaint: Complaint) -> Justification | None:
        """A complaint against this dealer, broadcast by new server ``sender`` (as the
        transport authenticated it, never as the complaint says): answered, once, by
        revealing the accuser's share, which the caller must broadcast. Refused
        (:class:`DkgError`) unless ``sender`` is its author, or anyone could have the dealer
        reveal any new server's share (with ``t'`` of them, the secret). None for a
        complaint against another dealer, or one answered already."""
        if complaint.accuser != sender or not 0 < sender <= self.n:
            raise DkgError(f"a complaint in the name of new server {complaint.accuser}, "
                           f"from {sender}")
        if complaint.dealer != self.index or sender in self._answered:
            return None
        self._answered.add(sender)
        return Justification(self.index, sender,
                             evaluate(self._polynomial, sender, self.group.order))


class ReshareRecipient:
    """New server ``index`` of ``n`` (threshold ``t``) receiving the old servers' shares of
    one secret. ``old_shares`` are the old set's public shares ``ĝ^(s_i)`` (old server
    number to element), ``old_t`` its threshold. Take every dealing and answer with
    :meth:`receive`, every private share with :meth:`receive_share`; broadcast
    :meth:`complaints` (everyone's go to :meth:`receive` too); then :meth:`finish`.

    ``sender`` is who the transport authenticated: the old server number of a dealer (its
    dealing and answers) or the new server number of a recipient (its complaints)."""

    def __init__(self, group: PairingGroup, index: int, t: int, n: int,
                 old_shares: Mapping[int, Element], old_t: int) -> None:
        _check_new_set(t, n)
        if not 0 < index <= n or not 0 < old_t <= len(old_shares):
            raise DkgError(f"need 0 < index <= n and old_t at most the old servers, got "
                           f"index={index}, n={n}, old_t={old_t}")
        self.group, self.index, self.t, self.n = group, index, t, n
        self.old_shares, self.old_t = dict(old_shares), old_t
        self._shares: dict[int, int] = {}
        self._dealings: dict[int, Dealing] = {}
        self._complaints: list[Complaint] = []
        self._justifications: list[Justification] = []

    def _dealer(self, sender: int) -> None:
        if sender not in self.old_shares:
            raise DkgError(f"old server {sender} is not one of the old set")

    def receive_share(self, sender: int, share: int) -> None:
        """The share old server ``sender`` sent this server over its private channel."""
        self._dealer(sender)
        if sender in self._shares:
            raise DkgError(f"a second share from old server {sender}")
        self._shares[sender] = share % self.group.order

    def receive(self, sender: int, message: Dealing | Complaint | Justification) -> None:
        """A broadcast message, refused unless ``sender`` is its author."""
        if isinstance(message, Complaint):
            if message.accuser != sender or not 0 < sender <= self.n:
                raise DkgError(f"new server {sender} sent a complaint in the name of new "
                               f"server {message.accuser}")
            self._dealer(message.dealer)
            if message not in self._complaints:
                self._complaints.append(message)
            return
        self._dealer(sender)
        if message.dealer != sender:
            raise DkgError(f"old server {sender} sent a message in the name of old server "
                           f"{message.dealer}")
        if isinstance(message, Dealing):
            if sender in self._dealings:
                raise DkgError(f"a second dealing from old server {sender}")
            self._dealings[sender] = message
        else:
            self._justifications.append(message)

    def _well_formed(self, dealing: Dealing) -> bool:
        """``t`` commitments in G2 whose ``C_0`` is the dealer's old public share (so it
        deals its share and nothing else), none of the others the identity."""
        identity = self.group.identity(G2)
        return (len(dealing.commitments) == self.t
                and all(c.kind is G2 for c in dealing.commitments)
                and dealing.commitments[0] == self.old_shares[dealing.dealer]
                and identity not in dealing.commitments[1:])

    def complaints(self) -> list[Complaint]:
        """Against every old server whose dealing came and whose share to this server did
        not, or does not verify."""
        return [Complaint(self.index, dealer)
                for dealer, dealing in sorted(self._dealings.items())
                if dealer not in self._shares
                or not share_is_valid(self.group, dealing, self.index, self._shares[dealer])]

    def finish(self) -> ReshareResult:
        """This server's new share and every new server's public share, from the ``old_t``
        qualified dealers with the lowest numbers."""
        qualified = answered_dealers(self.group, self._dealings, self._complaints,
                                     self._justifications, self._well_formed)
        if len(qualified) < self.old_t:
            raise DkgError(f"only {len(qualified)} old servers dealt their shares acceptably, "
                           f"fewer than the old threshold {self.old_t}")
        chosen = sorted(qualified)[:self.old_t]
        weights = lagrange_at_zero(chosen, self.group.order)
        own = shares_from(self.group, self.index, self._dealings, chosen, self._shares,
                          self._complaints, self._justifications)
        share = sum(weights[dealer] * own[dealer] for dealer in chosen) % self.group.order
        return ReshareResult(self.index, share, {j: self._public_share(chosen, weights, j)
                                                 for j in range(1, self.n + 1)},
                             frozenset(chosen))

    def _public_share(self, chosen: list[int], weights: Mapping[int, int], j: int) -> Element:
        """``ĝ^(s'_j) = prod_i prod_k C_ik^(lambda_i j^k)``, one multi-exponentiation."""
        q = self.group.order
        bases, exponents = [], []
        for dealer in chosen:
            for k, c in enumerate(self._dealings[dealer].commitments):
                bases.append(c)
                exponents.append(weights[dealer] * pow(j, k, q) % q)
        return self.group.multi_exp(bases, exponents)
