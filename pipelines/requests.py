"""One enrolment request -> its credential rows, or the reason it is rejected.

The per-request reference: ``decompose_request`` validates and decomposes one
request, and its parts (``check_request``, ``predicate_credentials``,
``check_row_count``) are what the column-wise batch decomposition (``batches``)
falls back to for every request or predicate it does not settle itself, so the
reasons of rejections are these, word for word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ibe_pubsub.credentials import (
    Credential,
    PredicateError,
    Schema,
    SchemaError,
    decompose,
    fine_credentials,
    parse_predicate,
)
from ibe_pubsub.pipelines.exceptions import PipelinesError

ROLES = ("subscriber", "publisher")
# The key server's identity names (keyserver.api_models.Name); checked here so a bad
# name is rejected before issuance, and so a name is always a safe file name.
IDENTITY_PATTERN = re.compile(r"[A-Za-z0-9_.@:+-]{1,200}")
# The key server accepts at most this many credentials (coarse + fine) per bulk item.
MAX_ROWS_PER_IDENTITY = 512


class Rejected(PipelinesError, ValueError):
    """A request that cannot be enrolled; the message is the operator-facing reason."""


@dataclass(frozen=True)
class Settings:
    """What decides the decomposition, identical on the driver and every executor."""

    schema: Schema
    fine_depth: int = 1
    max_credentials: int | None = None


@dataclass(frozen=True)
class CredentialRow:
    """One credential of an identity: ``credential`` is ``Credential.label()``."""

    attribute: str
    credential: str
    fine: bool
    position: int


def check_identity(identity: str | None) -> str:
    """The identity name, or Rejected if it is missing or not a valid key-server name."""
    if identity is None or identity == "":
        raise Rejected("missing identity")
    if not IDENTITY_PATTERN.fullmatch(identity):
        raise Rejected("identity must be 1-200 characters of A-Z a-z 0-9 _ . @ : + -")
    return identity


def check_request(identity: str | None, role: str | None, predicate: str | None,
                  copies: int = 1) -> None:
    """Rejected if the request itself is unusable, before its predicate is read.

    ``copies`` is how many requests of the input name this identity; an identity
    requested more than once is ambiguous, so every copy is rejected.
    """
    check_identity(identity)
    if role not in ROLES:
        raise Rejected(f"role must be 'subscriber' or 'publisher', got {role!r}")
    if copies > 1:
        raise Rejected(f"identity appears in {copies} requests")
    if predicate is None:
        raise Rejected("missing predicate (an empty predicate selects every event)")


def predicate_credentials(settings: Settings, predicate: str
                          ) -> tuple[list[Credential], list[Credential]]:
    """(coarse, fine) credentials of a predicate, each in schema order; Rejected if it is bad.

    The fine ones are those a subscriber gets (none with ``fine_depth`` 0)."""
    schema = settings.schema
    try:
        parsed = parse_predicate(schema, predicate)
        coarse = decompose(schema, parsed, settings.max_credentials)
    except PredicateError as exc:
        raise Rejected(f"predicate: {exc.message} (at position {exc.position})") from exc
    except (SchemaError, ValueError) as exc:
        raise Rejected(f"predicate: {exc}") from exc
    fine = fine_credentials(schema, coarse, settings.fine_depth) if settings.fine_depth > 0 \
        else {}
    return ([c for creds in coarse.values() for c in creds],
            [c for creds in fine.values() for c in creds])


def check_row_count(rows: int) -> None:
    """Rejected if an identity would get more credentials than the key server accepts."""
    if rows > MAX_ROWS_PER_IDENTITY:
        raise Rejected(f"{rows} credentials exceed the key server's limit of "
                       f"{MAX_ROWS_PER_IDENTITY} per identity; lower --fine-depth or set "
                       "--max-credentials")


def decompose_request(settings: Settings, identity: str | None, role: str | None,
                      predicate: str | None, copies: int = 1) -> list[CredentialRow]:
    """Credential rows of one request: coarse credentials in schema order, then fine ones.

    The reference for one request at a time; ``batches`` computes the same rows for a
    whole batch column-wise.
    """
    check_request(identity, role, predicate, copies)
    coarse, fine = predicate_credentials(settings, predicate)  # type: ignore[arg-type]
    rows = [CredentialRow(c.attribute, c.label(), False, c.position) for c in coarse]
    if role == "subscriber":
        rows += [CredentialRow(c.attribute, c.label(), True, c.position) for c in fine]
    check_row_count(len(rows))
    return rows
