"""Actor names the key server writes into the audit log for callers that are no identity.

An identity's name is its actor name too (and its key in the rate limits and the issuer's
fair queue), so no identity may take one of these, in any letter case: its audit rows
would pass for the admin's, an anonymous caller's or the server's own.
"""

from __future__ import annotations

ADMIN = "admin"
"""The holder of the admin token (identity administration, bulk issuance)."""
ANONYMOUS = "anonymous"
"""A caller refused before it was identified (no or an invalid token)."""
SERVER = "keyserver"
"""The server about itself, e.g. how many refusals it could not audit."""

RESERVED = frozenset({ADMIN, ANONYMOUS, SERVER})


def is_reserved(name: str) -> bool:
    return name.casefold() in RESERVED
