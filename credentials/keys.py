"""Key material of the scheme (docs/scheme.md) as immutable dataclasses (names: Pr^p, Pr^s)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.groups import Element, PreparedG2

SCHEME_VERSION = 2


@dataclass(frozen=True)
class MasterPublicKey:
    """MPK = (curve, scheme version, g, ĝ, g2, h, hd, Y); every peer has it. ``h`` is the
    search base (tags, tokens), ``hd`` the decryption base (C0, D), kept apart so that C0
    cannot test a tag."""

    curve: str
    g: Element
    g_hat: Element
    g2: Element
    h: Element
    hd: Element
    Y: Element
    version: int = SCHEME_VERSION


@dataclass(frozen=True)
class MasterSecretKey:
    """MSK = (alpha, phi, beta); only the key server has it."""

    alpha: int
    phi: int
    beta: int


@dataclass(frozen=True)
class PublisherKey:
    """Pr^p for one credential: P1 = g2^alpha * F(Pu_PUB)^gamma, P2 = ĝ^gamma."""

    credential: Credential
    epoch: int
    P1: Element
    P2: Element


@dataclass(frozen=True)
class BlindedToken:
    """What a parent receives: T with its attribute and position, not the credential itself.

    The route test needs only the position; the bits stay with the subscriber (a parent can
    still guess them, see the known limits in docs/scheme.md)."""

    attribute: str
    position: int
    epoch: int
    T: Element


@dataclass(frozen=True)
class RoutingToken:
    """Pr^s[3]: T = F(Pu_SUB)^phi, handed to a parent to route on a (fine) credential."""

    credential: Credential
    epoch: int
    T: Element

    @property
    def attribute(self) -> str:
        return self.credential.attribute

    @property
    def position(self) -> int:
        return self.credential.position

    def blinded(self) -> BlindedToken:
        return BlindedToken(self.attribute, self.position, self.epoch, self.T)


@dataclass(frozen=True)
class SubscriberCredentialKey:
    """Pr^s[1..3] for one credential: S1 = g2^gamma_s * F^gamma, S2 = ĝ^gamma, T = F^phi."""

    credential: Credential
    epoch: int
    S1: Element
    S2: Element
    T: Element
    #: Miller-loop precomputation of S2, paired once per decryption.
    S2_prepared: PreparedG2 | None = field(default=None, compare=False, repr=False)

    @property
    def token(self) -> RoutingToken:
        return RoutingToken(self.credential, self.epoch, self.T)


@dataclass(frozen=True)
class SubscriberKey:
    """A subscriber's keys of one epoch, bound by one gamma_s: D = g2^((gamma_s+alpha)/beta)."""

    epoch: int
    D: Element
    credentials: tuple[SubscriberCredentialKey, ...]
    fine_tokens: tuple[RoutingToken, ...] = ()

    def for_attribute(self, attribute: str) -> tuple[SubscriberCredentialKey, ...]:
        return tuple(k for k in self.credentials if k.credential.attribute == attribute)
