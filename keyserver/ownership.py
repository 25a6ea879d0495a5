"""Address ownership: an address belongs to the identity whose peer-link certificate names it,
until that certificate expires, and only its owner may list it in the directory.

Certifying an address claims it: refused (409 ``address_taken``) while another identity's
certificate for it is live, otherwise the row is the caller's until its latest certificate
naming it expires. A row is never deleted before then, whatever happens (revocation
included), because the certificates naming its address stay valid until then: freeing it
early would let a second identity hold a valid certificate for the same address, and
impersonate whoever listens there next. An identity holds at most ``cap`` live addresses:
a certification that would take it beyond is refused (409 ``too_many_addresses``), never
made room for, so one identity cannot fill the directory with dead addresses nor collect
certificates for a range of addresses; re-certifying an address it holds always works.

Claims read the row, then change it; a concurrent first claim of the same address fails on
the primary key (the caller retries once) and a takeover of an expired row is a
conditional UPDATE, so two identities can never both take one address, on SQLite or
PostgreSQL. The cap is counted after the claims, within their transaction, with the
identity's row locked (``FOR UPDATE`` on PostgreSQL; on SQLite the claims' writes already
hold the database's write lock), so concurrent requests of one identity cannot pass it
together.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from ibe_pubsub.credentials import PeerCertificateError, canonical_address
from ibe_pubsub.keyserver.db import Identity, PeerAddress
from ibe_pubsub.keyserver.errors import ApiError


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


def when(timestamp: float) -> str:
    """A Unix time as people read it, with the number the JSON detail carries."""
    iso = datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
    return f"{iso.replace('+00:00', 'Z')} ({timestamp:.0f} Unix time)"


def _held_by_other(row: PeerAddress | None, identity_id: int, now: float) -> bool:
    return row is not None and row.identity_id != identity_id and row.expires_at > now


def _taken(address: str, until: float) -> ApiError:
    return ApiError(409, f"{address} is certified to another identity until {when(until)}",
                    "address_taken", {"address": address, "until": until})


def _claim(session: Session, identity_id: int, address: str, now: float,
           expires_at: float) -> bool:
    """Make ``address`` the identity's until at least ``expires_at`` (409 ``address_taken``
    while another identity's certificate names it); True if it already was."""
    row = session.get(PeerAddress, address)
    if row is None:
        session.add(PeerAddress(address=address, identity_id=identity_id, certified_at=now,
                                expires_at=expires_at))
        session.flush()  # a concurrent first claim fails here: IntegrityError
        return False
    if _held_by_other(row, identity_id, now):
        raise _taken(address, row.expires_at)
    held = row.identity_id == identity_id and row.expires_at > now
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
    return held


def _check_cap(session: Session, identity_id: int, addresses: Sequence[str], held: int,
               now: float, cap: int) -> None:
    """409 ``too_many_addresses`` if the identity, having claimed ``addresses`` (of which it
    held ``held`` already), now holds more than ``cap`` live addresses and one of them is
    new: renewing only addresses it holds is never refused, even above a lowered cap."""
    if held == len(addresses):
        return
    live = session.execute(
        select(PeerAddress.address, PeerAddress.expires_at)
        .where(PeerAddress.identity_id == identity_id, PeerAddress.expires_at > now)).all()
    if len(live) <= cap:
        return
    others = sorted(until for address, until in live if address not in addresses)
    # when enough of the others have expired for this request to fit (for one new address,
    # when the earliest does); a certificate it renews meanwhile moves this later
    until = others[len(live) - cap - 1]
    holds = len(others) + held
    raise ApiError(409, f"this identity holds {holds} live certified addresses and this "
                   f"server allows at most {cap}: reuse one of them (re-certifying an address "
                   "the identity holds always works, e.g. a peer restarted with --listen "
                   f"HOST:PORT on a fixed port) or wait until {when(until)}, when "
                   "enough of them have expired", "too_many_addresses",
                   {"held": holds, "cap": cap, "until": until})


def claim_addresses(session: Session, identity_id: int, addresses: Sequence[str], now: float,
                    expires_at: float, cap: int) -> None:
    """Make the identity the owner of ``addresses`` until ``expires_at``, or raise 409
    ``address_taken`` (another identity's certificate names one) or ``too_many_addresses``
    (the identity would hold more than ``cap`` live addresses)."""
    # PostgreSQL: one claim of an identity at a time, so its cap is counted with the other's
    # claims committed (SQLite ignores FOR UPDATE; there the claims' writes serialize).
    session.execute(select(Identity.id).where(Identity.id == identity_id).with_for_update())
    held = sum(_claim(session, identity_id, address, now, expires_at)
               for address in addresses)
    _check_cap(session, identity_id, addresses, held, now, cap)


def held_addresses(session: Session, identity_id: int, now: float) -> list[tuple[str, float]]:
    """The identity's live addresses with their expiry, latest first: a restarted peer
    certifies one of them again rather than take a new one toward its cap."""
    rows = session.execute(
        select(PeerAddress.address, PeerAddress.expires_at)
        .where(PeerAddress.identity_id == identity_id, PeerAddress.expires_at > now)
        .order_by(PeerAddress.expires_at.desc(), PeerAddress.address)).all()
    return [(address, until) for address, until in rows]


def owned_until(session: Session, identity_id: int, address: str, now: float) -> float:
    """When the identity's ownership of ``address`` ends; 403 ``address_not_certified``
    unless it owns it now."""
    row = session.get(PeerAddress, address)
    if row is None or row.identity_id != identity_id or row.expires_at <= now:
        raise ApiError(403, f"{address} is not certified to this identity (certify it with "
                       "POST /v1/enrol/transport first, /v3/enrol/transport at a threshold "
                       "member)", "address_not_certified",
                       {"address": address})
    return row.expires_at


def check_not_owned_by_other(session: Session, identity_id: int, address: str,
                             now: float) -> None:
    """403 ``not_owner`` while another identity owns ``address``."""
    row = session.get(PeerAddress, address)
    if _held_by_other(row, identity_id, now):
        raise ApiError(403, f"{address} is certified to another identity", "not_owner",
                       {"address": address})
