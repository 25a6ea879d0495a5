"""Address ownership: an address belongs to the identity whose peer-link certificate names it,
until that certificate expires, and only its owner may list it in the directory.

Certifying an address claims it: refused (409 ``address_taken``) while another identity's
certificate for it is live, otherwise the row is the caller's until its latest certificate
naming it expires. An identity holds at most ``cap`` addresses: certifying more evicts its
oldest-certified ones with their directory entries, so a peer restarted on a new port
keeps working while one identity cannot fill the directory with dead addresses.

Claims read the row, then change it; a concurrent first claim of the same address fails on
the primary key (the caller retries once) and a takeover of an expired row is a
conditional UPDATE, so two identities can never both take one address, on SQLite or
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from credentials.peer_certificates import PeerCertificateError, canonical_address
from keyserver.db import DirectoryEntry, PeerAddress
from keyserver.errors import ApiError


def check_canonical(addresses: Sequence[str], field: str) -> None:
    """422 for an address that is not ``host:port`` in the one spelling certificates use,
    naming the canonical form when there is one."""
    for address in addresses:
        try:
            canonical = canonical_address(address)
        except PeerCertificateError as exc:
            raise ApiError(422, f"{field}: {exc}", "invalid_address") from exc
        if canonical != address:
            raise ApiError(422, f"{field}: {address!r} is not in canonical form, write "
                           f"{canonical!r}", "non_canonical_address",
                           {"address": address, "canonical": canonical})


def _held_by_other(row: PeerAddress | None, identity_id: int, now: float) -> bool:
    return row is not None and row.identity_id != identity_id and row.expires_at > now


def _taken(address: str, until: float) -> ApiError:
    return ApiError(409, f"{address} is certified to another identity until {until:.0f} "
                    "(Unix time)", "address_taken", {"address": address, "until": until})


def _claim(session: Session, identity_id: int, address: str, now: float,
           expires_at: float) -> None:
    row = session.get(PeerAddress, address)
    if row is None:
        session.add(PeerAddress(address=address, identity_id=identity_id, certified_at=now,
                                expires_at=expires_at))
        session.flush()  # a concurrent first claim fails here: IntegrityError
        return
    if _held_by_other(row, identity_id, now):
        raise _taken(address, row.expires_at)
    if row.identity_id == identity_id:  # a this-epoch certificate after a next-epoch one
        expires_at = max(expires_at, row.expires_at)
    # Only if still ours or expired: another claim may have committed since the read.
    done = session.execute(
        update(PeerAddress)
        .where(PeerAddress.address == address,
               or_(PeerAddress.identity_id == identity_id, PeerAddress.expires_at <= now))
        .values(identity_id=identity_id, certified_at=now, expires_at=expires_at)
        .execution_options(synchronize_session="fetch"))
    if done.rowcount != 1:  # type: ignore[attr-defined]
        until = session.scalar(select(PeerAddress.expires_at)
                               .where(PeerAddress.address == address))
        raise _taken(address, now if until is None else until)


def _evict(session: Session, identity_id: int, kept: Sequence[str], cap: int) -> list[str]:
    """Drop the identity's addresses beyond ``cap``, oldest-certified first, never ``kept``,
    and its directory entries for them."""
    older = session.scalars(
        select(PeerAddress.address)
        .where(PeerAddress.identity_id == identity_id, PeerAddress.address.not_in(kept))
        .order_by(PeerAddress.certified_at.desc(), PeerAddress.address)).all()
    evicted = list(older[max(0, cap - len(kept)):])
    if evicted:
        session.execute(delete(PeerAddress).where(
            PeerAddress.identity_id == identity_id, PeerAddress.address.in_(evicted))
            .execution_options(synchronize_session="fetch"))
        session.execute(delete(DirectoryEntry).where(
            DirectoryEntry.identity_id == identity_id, DirectoryEntry.address.in_(evicted)))
    return evicted


def claim_addresses(session: Session, identity_id: int, addresses: Sequence[str], now: float,
                    expires_at: float, cap: int) -> list[str]:
    """Make the identity the owner of ``addresses`` (at most ``cap``) until ``expires_at``,
    or raise 409 ``address_taken``; returns the addresses it lost to the cap."""
    for address in addresses:
        _claim(session, identity_id, address, now, expires_at)
    return _evict(session, identity_id, addresses, cap)


def owned_until(session: Session, identity_id: int, address: str, now: float) -> float:
    """When the identity's ownership of ``address`` ends; 403 ``address_not_certified``
    unless it owns it now."""
    row = session.get(PeerAddress, address)
    if row is None or row.identity_id != identity_id or row.expires_at <= now:
        raise ApiError(403, f"{address} is not certified to this identity (certify it with "
                       "POST /v1/enrol/transport first)", "address_not_certified",
                       {"address": address})
    return row.expires_at


def check_not_owned_by_other(session: Session, identity_id: int, address: str,
                             now: float) -> None:
    """403 ``not_owner`` while another identity owns ``address``."""
    row = session.get(PeerAddress, address)
    if _held_by_other(row, identity_id, now):
        raise ApiError(403, f"{address} is certified to another identity", "not_owner",
                       {"address": address})


def remove_peer_addresses(session: Session, identity_id: int) -> None:
    """Forget every address of an identity (on revocation)."""
    session.execute(delete(PeerAddress).where(PeerAddress.identity_id == identity_id))
