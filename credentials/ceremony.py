"""The sequential ``beta`` ceremony of the threshold key service (docs/scheme.md, version 3,
setup step 2).

``beta`` enters keys only through public points, so it is never shared: it is built as a
product ``beta = prod beta_j`` that nobody knows. Starting from ``(W, G, hd) = (g2, g2, ĝ)``,
each server in turn draws ``beta_j`` and publishes ``(W^beta_j, G^(1/beta_j), hd^beta_j)``
with a Schnorr proof of knowledge of ``beta_j`` over ``hd``. Everyone checks the proof and
``e(W, ĝ) = e(g2, hd)``, ``e(G, hd) = e(g2, ĝ)``. The proof is what stops the last server
from replacing ``hd`` with a point whose logarithm it knows (which would give it
``beta``); the pairings tie ``W`` and ``G`` to that same ``beta``. If one server is
honest and forgets its ``beta_j``, ``beta`` is unknown to all.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G2, GT, Element, PairingGroup

PROOF_LABEL = b"IBE-PUBSUB-V3-BETA-POK"


class CeremonyError(CredentialsError, ValueError):
    """A step of the ceremony does not verify: it must not be built upon."""


@dataclass(frozen=True)
class BetaState:
    """``W = g2^beta`` (G1), ``G = g2^(1/beta)`` (G1), ``hd = ĝ^beta`` (G2) so far."""

    W: Element
    G: Element
    hd: Element


@dataclass(frozen=True)
class BetaStep:
    """Server ``server``'s contribution: the new state and a Schnorr proof ``(R, z)`` of
    ``beta_j`` with ``state.hd = previous.hd^beta_j``."""

    server: int
    state: BetaState
    R: Element
    z: int


def initial_beta_state(g2: Element, g_hat: Element) -> BetaState:
    """``(g2, g2, ĝ)``: beta = 1 before the first step."""
    return BetaState(W=g2, G=g2, hd=g_hat)


def proof_challenge(group: PairingGroup, deployment: bytes, server: int, previous: BetaState,
               state: BetaState, R: Element) -> int:
    """Fiat-Shamir: the deployment and the server are bound, so a proof cannot be replayed
    by another server or in another deployment."""
    digest = hashlib.sha512(b"".join((
        PROOF_LABEL, len(deployment).to_bytes(2, "big"), deployment,
        server.to_bytes(4, "big"), bytes(previous.hd), bytes(state.hd), bytes(state.W),
        bytes(state.G), bytes(R)))).digest()
    return int.from_bytes(digest, "big") % group.order


def beta_step(group: PairingGroup, deployment: bytes, server: int, previous: BetaState
              ) -> BetaStep:
    """Draw ``beta_j`` and ``r``; ``(W^beta_j, G^(1/beta_j), hd^beta_j)``; ``R = hd^r``,
    ``c = H(...)``, ``z = r + c * beta_j``. ``beta_j`` is forgotten on return."""
    q = group.order
    beta_j, r = group.random_scalar(), group.random_scalar()
    state = BetaState(W=group.exp_secret(previous.W, beta_j),
                      G=group.exp_secret(previous.G, pow(beta_j, -1, q)),
                      hd=group.exp_secret(previous.hd, beta_j))
    R = group.exp_secret(previous.hd, r)
    c = proof_challenge(group, deployment, server, previous, state, R)
    return BetaStep(server, state, R, (r + c * beta_j) % q)


def check_beta_step(group: PairingGroup, deployment: bytes, g2: Element, previous: BetaState,
                    step: BetaStep, server: int) -> BetaState:
    """The new state if ``step`` is server ``server``'s (the servers take their turns in
    the order of their numbers, from :func:`initial_beta_state`) and verifies:
    ``previous.hd^z = R * hd^c``, ``e(W, ĝ) = e(g2, hd)``, ``e(G, hd) = e(g2, ĝ)``, and no
    identity element."""
    state, g_hat = step.state, group.generator(G2)
    if step.server != server:
        raise CeremonyError(f"expected the step of server {server}, got one of {step.server}")
    if any(bytes(x) == bytes(group.identity(x.kind)) for x in (state.W, state.G, state.hd)):
        raise CeremonyError(f"server {step.server}'s step holds the identity element")
    c = proof_challenge(group, deployment, step.server, previous, state, step.R)
    if previous.hd ** step.z != step.R * state.hd ** c:
        raise CeremonyError(f"server {step.server}'s proof of knowledge does not verify")
    one = group.identity(GT)
    if (group.multi_pair([(state.W, g_hat), (~g2, state.hd)]) != one
            or group.multi_pair([(state.G, state.hd), (~g2, g_hat)]) != one):
        raise CeremonyError(f"server {step.server}'s W and G do not match its hd")
    return state
