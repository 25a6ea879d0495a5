"""Pedersen's distributed key generation, with Feldman commitments in G2 and complaints
(docs/scheme.md, section 16.1), as a sans-I/O participant.

Each of ``n`` servers deals a random polynomial of degree ``t - 1``: it broadcasts the
commitments ``C_k = ĝ^(a_k)`` and sends server ``j`` the share ``f(j)`` privately. A
recipient checks ``ĝ^(f(j)) = prod_k C_k^(j^k)`` and complains openly if that fails or the
share never came; the dealer answers by revealing that share, which everyone checks.
Dealers with a malformed dealing, an unanswered complaint, a wrong answer or two
different answers to one complaint are disqualified. The secret is the sum of the
qualified dealers' ``a_0``, which nobody ever forms: server ``j`` keeps the sum of its
shares, and everyone computes the public key ``ĝ^x = prod C_0`` and every server's public
share ``ĝ^(x_j)``, which make later partial results publicly checkable.

**What the transport must give** (the caller's part; this module only takes and returns
messages): private, authenticated channels for the shares, and one authenticated,
consistent broadcast for dealings, complaints and answers, so that every honest server
sees the same messages and knows who sent each. Every message names its author, and a
participant refuses one whose author is not its sender: otherwise a server could complain
in another's name and make honest dealers reveal that server's shares.

**A sharing of zero** (``zero=True``, for the threshold key service's ``rho``): every
dealer's constant term is 0 and its ``C_0`` the identity, so whatever dealers qualify,
the shared secret is 0 by construction; the public shares ``ĝ^(rho_j)`` still make each
server's use of its share checkable, and ``t`` of them interpolate to the identity.

It needs ``n >= 2t - 1``: then the at most ``t - 1`` corrupt servers leave ``t`` honest
ones whose shares fix every qualified polynomial, so no dealer can commit to a ``C_0`` it
does not know the logarithm of (which would let colluding dealers choose the public key).
Pedersen's generation still lets a dealer that sees the others' commitments first bias
the public key's distribution a little, by getting itself disqualified (Gennaro et al.);
for keys used as here that is known not to help an attacker, and the secret shares stay
uniformly distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G2, Element, PairingGroup
from ibe_pubsub.credentials.shamir import evaluate, random_polynomial


class DkgError(CredentialsError, ValueError):
    """A message that must be refused, or a key generation that cannot finish."""


@dataclass(frozen=True)
class Dealing:
    """What dealer ``dealer`` broadcasts: ``C_k = ĝ^(a_k)`` for k = 0 .. t-1."""

    dealer: int
    commitments: tuple[Element, ...]


@dataclass(frozen=True)
class Complaint:
    """``accuser`` says the share ``dealer`` sent it is wrong or missing."""

    accuser: int
    dealer: int


@dataclass(frozen=True)
class Justification:
    """The dealer's answer to a complaint: the accuser's share, revealed to everyone."""

    dealer: int
    accuser: int
    share: int


@dataclass(frozen=True)
class DkgResult:
    """A server's outcome: its secret share ``x_index``, and what everyone knows."""

    index: int
    share: int
    public_key: Element
    public_shares: Mapping[int, Element]
    qualified: frozenset[int]


def deal(group: PairingGroup, dealer: int, polynomial: Sequence[int], n: int
         ) -> tuple[Dealing, dict[int, int]]:
    """``C_k = ĝ^(a_k)`` (the identity for a zero coefficient) and ``f(j)`` for each
    recipient ``j`` of 1..n."""
    g_hat, q = group.generator(G2), group.order
    commitments = tuple(group.exp_secret(g_hat, a) if a else group.identity(G2)
                        for a in polynomial)
    return Dealing(dealer, commitments), {j: evaluate(polynomial, j, q) for j in range(1, n + 1)}


def commitment_at(group: PairingGroup, dealing: Dealing, index: int) -> Element:
    """``prod_k C_k^(index^k) = ĝ^(f(index))``, from public values only."""
    return group.multi_exp(list(dealing.commitments),
                           [pow(index, k, group.order) for k in range(len(dealing.commitments))])


def share_is_valid(group: PairingGroup, dealing: Dealing, recipient: int, share: int) -> bool:
    """``ĝ^share == prod_k C_k^(recipient^k)``: the share lies on the committed polynomial."""
    return group.exp_secret(group.generator(G2), share) == commitment_at(group, dealing,
                                                                          recipient)


def is_well_formed(group: PairingGroup, dealing: Dealing, t: int, n: int,
                   zero: bool = False) -> bool:
    """A dealer in 1..n, exactly ``t`` commitments in G2, none the identity (a zero
    coefficient would let the dealer lower the polynomial's degree or cancel others'
    secrets), except ``C_0`` of a sharing of zero, which must be."""
    identity = group.identity(G2)
    return (0 < dealing.dealer <= n and len(dealing.commitments) == t
            and all(c.kind is G2 for c in dealing.commitments)
            and (dealing.commitments[0] == identity) is zero
            and identity not in dealing.commitments[1:])


def qualified_dealers(group: PairingGroup, dealings: Mapping[int, Dealing], t: int, n: int,
                      complaints: Sequence[Complaint],
                      justifications: Sequence[Justification],
                      zero: bool = False) -> frozenset[int]:
    """The dealers that stay, from broadcast messages whose authors were checked:
    well-formed, every complaint against them answered with one share that verifies for
    its accuser (:func:`answered_dealers`)."""
    return answered_dealers(group, dealings, complaints, justifications,
                            lambda dealing: is_well_formed(group, dealing, t, n, zero))


def answered_dealers(group: PairingGroup, dealings: Mapping[int, Dealing],
                     complaints: Sequence[Complaint], justifications: Sequence[Justification],
                     well_formed: Callable[[Dealing], bool]) -> frozenset[int]:
    """The dealers whose dealing is ``well_formed`` and who answered every complaint
    against them with one share that verifies for its accuser (the same answer delivered
    twice counts once: a transport that repeats a message must not split the servers'
    views; two different answers disqualify)."""
    answers: dict[tuple[int, int], list[int]] = {}
    for j in dict.fromkeys(justifications):
        answers.setdefault((j.dealer, j.accuser), []).append(j.share)
    qualified = set()
    for dealer, dealing in dealings.items():
        if not well_formed(dealing):
            continue
        accusers = {c.accuser for c in complaints if c.dealer == dealer}
        given = {a: shares for (d, a), shares in answers.items() if d == dealer}
        if accusers <= set(given) and all(
                len(shares) == 1 and share_is_valid(group, dealing, a, shares[0])
                for a, shares in given.items()):
            qualified.add(dealer)
    return frozenset(qualified)


class Participant:
    """Server ``index`` of ``n`` in one key generation with threshold ``t``.

    The phases, each after every server finished the one before (the caller's rounds):
    send :meth:`dealing` (broadcast the commitments, each share to its server); take
    every dealing with :meth:`receive` and every share with :meth:`receive_share`;
    broadcast :meth:`complaints`, and take everyone's with :meth:`receive` (which returns
    this dealer's answer to broadcast); take the answers with :meth:`receive`; then
    :meth:`finish`.
    With ``zero``, the shared secret is 0 (a sharing of zero, above).
    """

    def __init__(self, group: PairingGroup, index: int, t: int, n: int,
                 zero: bool = False) -> None:
        if t < 1 or n < 2 * t - 1 or not 0 < index <= n:
            raise DkgError(f"need t >= 1, n >= 2t - 1 and 0 < index <= n, got t={t}, n={n}, "
                           f"index={index}")
        self.group, self.index, self.t, self.n, self.zero = group, index, t, n, zero
        polynomial = random_polynomial(group.random_scalar, t - 1)
        self._polynomial = (0, *polynomial[1:]) if zero else polynomial
        self._shares: dict[int, int] = {}
        self._dealings: dict[int, Dealing] = {}
        self._complaints: list[Complaint] = []
        self._justifications: list[Justification] = []

    def dealing(self) -> tuple[Dealing, dict[int, int]]:
        """The broadcast commitments and the private share for each server (its own
        included)."""
        return deal(self.group, self.index, self._polynomial, self.n)

    def _member(self, sender: int) -> None:
        if not 0 < sender <= self.n:
            raise DkgError(f"message from {sender}, not a server of 1..{self.n}")

    def receive_share(self, sender: int, share: int) -> None:
        """The share dealer ``sender`` sent this server over its private channel."""
        self._member(sender)
        if sender in self._shares:
            raise DkgError(f"a second share from dealer {sender}")
        self._shares[sender] = share % self.group.order

    def receive(self, sender: int, message: Dealing | Complaint | Justification
                ) -> Justification | None:
        """A broadcast message from ``sender``, refused unless ``sender`` is its author;
        a complaint against this server returns its answer, to broadcast."""
        self._member(sender)
        author = (message.accuser if isinstance(message, Complaint) else message.dealer)
        if author != sender:
            raise DkgError(f"server {sender} sent a message in the name of server {author}")
        if isinstance(message, Dealing):
            if sender in self._dealings:
                raise DkgError(f"a second dealing from dealer {sender}")
            self._dealings[sender] = message
        elif isinstance(message, Complaint):
            self._member(message.dealer)
            if message in self._complaints:  # answered already
                return None
            self._complaints.append(message)
            if message.dealer == self.index:
                return Justification(self.index, sender, evaluate(
                    self._polynomial, sender, self.group.order))
        else:
            self._justifications.append(message)
        return None

    def complaints(self) -> list[Complaint]:
        """Against every dealer whose dealing came and whose share to this server did not,
        or does not verify."""
        return [Complaint(self.index, dealer)
                for dealer, dealing in sorted(self._dealings.items())
                if dealer not in self._shares
                or not share_is_valid(self.group, dealing, self.index, self._shares[dealer])]

    def finish(self) -> DkgResult:
        """This server's share of the qualified dealers' secret, the public key and every
        server's public share."""
        qualified = qualified_dealers(self.group, self._dealings, self.t, self.n,
                                      self._complaints, self._justifications, self.zero)
        if len(qualified) < self.t:
            raise DkgError(f"only {len(qualified)} qualified dealers, fewer than t={self.t}")
        chosen = [self._dealings[d] for d in sorted(qualified)]
        own = shares_from(self.group, self.index, self._dealings, sorted(qualified),
                          self._shares, self._complaints, self._justifications)
        share = sum(own.values()) % self.group.order
        public_key = chosen[0].commitments[0]
        for dealing in chosen[1:]:
            public_key = public_key * dealing.commitments[0]
        return DkgResult(self.index, share, public_key,
                         {j: public_share(self.group, chosen, j) for j in range(1, self.n + 1)},
                         qualified)


def shares_from(group: PairingGroup, index: int, dealings: Mapping[int, Dealing],
                chosen: Sequence[int], shares: Mapping[int, int],
                complaints: Sequence[Complaint], justifications: Sequence[Justification]
                ) -> dict[int, int]:
    """Server ``index``'s share from each dealer of ``chosen``: the one it received, or,
    where it complained, the dealer's broadcast answer (any other answer naming it is
    ignored); :class:`DkgError` if one does not verify (a qualified dealer answered each
    of this server's complaints with a valid share)."""
    mine = {c.dealer for c in complaints if c.accuser == index}
    answered = {j.dealer: j.share for j in justifications
                if j.accuser == index and j.dealer in mine}
    own = {}
    for dealer in chosen:
        share = answered.get(dealer) if dealer in mine else shares.get(dealer)
        if share is None or not share_is_valid(group, dealings[dealer], index, share):
            raise DkgError(f"no valid share from dealer {dealer}, and no complaint of this "
                           "server against it was broadcast")
        own[dealer] = share
    return own


def public_share(group: PairingGroup, dealings: Sequence[Dealing], index: int) -> Element:
    """``ĝ^(x_index) = prod_d prod_k C_{d,k}^(index^k)`` over the qualified dealings."""
    total = commitment_at(group, dealings[0], index)
    for dealing in dealings[1:]:
        total = total * commitment_at(group, dealing, index)
    return total
