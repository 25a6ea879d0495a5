"""Shamir polynomials over Z_q, for the threshold key service (docs/scheme.md, version 3):
a secret is ``f(0)`` of a random polynomial of degree ``t - 1``, server ``i`` holds
``f(i)``, and any ``t`` shares give ``f(0)`` back with the Lagrange weights at 0, also
"in the exponent" (``prod_i X_i^lambda_i``), which is how keys and signatures combine
without anyone forming the secret."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ibe_pubsub.credentials.exceptions import CredentialsError


class ShareSetError(CredentialsError, ValueError):
    """A set of share indices Lagrange weights cannot be computed for."""


def random_polynomial(random_scalar: Callable[[], int], degree: int) -> tuple[int, ...]:
    """Coefficients ``a_0 .. a_degree``, each drawn from Z_q* (``a_0`` is the secret)."""
    return tuple(random_scalar() for _ in range(degree + 1))


def evaluate(coefficients: Sequence[int], x: int, order: int) -> int:
    """``f(x) = sum_k a_k x^k mod q`` (Horner)."""
    value = 0
    for a in reversed(coefficients):
        value = (value * x + a) % order
    return value


def lagrange_at(indices: Iterable[int], x: int, order: int) -> dict[int, int]:
    """``lambda_i(x) = prod_{j != i} (x - j) / (i - j) mod q`` for each index ``i`` of the
    set, so that ``f(x) = sum_i lambda_i(x) f(i)`` for every polynomial of degree below
    the set's size. Indices are the servers' numbers, 1 to n: distinct, non-zero, below
    ``q``."""
    chosen = list(indices)
    if not chosen or len(set(chosen)) != len(chosen) or any(
            not 0 < i < order for i in chosen):
        raise ShareSetError(f"share indices must be distinct numbers in 1..q-1, got {chosen}")
    weights = {}
    for i in chosen:
        numerator, denominator = 1, 1
        for j in chosen:
            if j != i:
                numerator = numerator * (x - j) % order
                denominator = denominator * (i - j) % order
        weights[i] = numerator * pow(denominator, -1, order) % order
    return weights


def lagrange_at_zero(indices: Iterable[int], order: int) -> dict[int, int]:
    """The weights that give ``f(0)``, the secret, from the shares of ``indices``."""
    return lagrange_at(indices, 0, order)
