"""Protocol parameters shared by every peer of an overlay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ibe_pubsub.overlay.exceptions import OverlayError

Routing = Literal["ohf", "mcr"]


class OverlayConfigError(OverlayError, ValueError):
    """A protocol or simulator parameter out of its range."""


@dataclass(frozen=True)
class OverlayConfig:
    """Timers are in seconds of the clock the driver passes in (``now``)."""

    #: Maximum number of children per virtual peer (out-degree).
    max_children: int = 4
    #: One-hop flooding or multi-credential routing (report 7.4).
    routing: Routing = "ohf"
    #: How many more peers a connection request may visit on its way.
    hop_limit: int = 24
    heartbeat_interval: float = 1.0
    #: A parent or child silent for this long is considered gone.
    failure_timeout: float = 3.5
    #: Retry a join that got no acceptance after this long (with a new join id).
    join_timeout: float = 2.0
    #: A contact whose join got no answer at all is passed over for this long when others
    #: remain: a dead address from the directory costs one join timeout, not one per try.
    silent_contact_period: float = 30.0
    #: Attempts to find each further distinct parent. Then MCR without push backups shares
    #: one; with push backups (see ``push_backup``) a virtual peer with one parent, not
    #: on the root's peer, tries again every ``rotate_interval / 2`` seconds (or
    #: ``silent_contact_period``), and one with two stops searching.
    mcr_link_attempts: int = 3
    #: Check the publisher's signature before forwarding (costs one verify per hop).
    verify_before_forward: bool = False
    #: Capacity of every duplicate-suppression memory.
    dedup_capacity: int = 8192
    #: Relays a subscriber's virtual peer may split off (each adds up to ``max_children - 1``
    #: children to its physical peer's load); a root, which alone covers every newcomer,
    #: has no such limit.
    max_relays: int = 4
    #: A leaving peer forwards to the children it handed over until each has detached
    #: (linked elsewhere), for at most this long (make before break).
    leave_linger: float = 6.0
    #: How long keys of the previous epoch stay valid after a rollover.
    grace: float = 60.0
    #: After attaching, a subscriber virtual peer with free child slots asks its parent,
    #: every ``recruit_interval`` seconds and ``recruit_rounds`` times, to offer it up to
    #: ``recruit_sample`` of its finer children; those it covers move under it by a swap.
    #: This deepens trees that joins in arrival order leave flat.
    recruit_rounds: int = 3
    recruit_interval: float = 5.0
    recruit_sample: int = 8
    #: Repair against peers that drop events: every subscriber virtual peer asks the nearest
    #: covering ancestor beyond its parent (which the parent names) to be its *backup*. A
    #: backup sends it, every ``digest_interval`` seconds, the ids of the events that reached
    #: the backup at least that long ago, each with the route entry at the watcher's
    #: position; the watcher tests the entries of ids it lacks with its own token (no token
    #: leaves it) and pulls the ones that match. None: the routing's default (see
    #: :attr:`repairs`).
    repair: bool | None = None
    #: The pull repair: a virtual peer that nobody named a backup to (a lying parent names
    #: none) asks a parent that proved it delivers, or searches a covering peer itself,
    #: every few failure timeouts (see ``Joining.search_backup``).
    backup_searches: bool = True
    #: Backups per virtual peer: the first is a parent's parent, a further one the parent
    #: of a backup or of another parent (the repair fails only where all of them drop).
    backups: int = 2
    digest_interval: float = 1.0
    #: Virtual peers one virtual peer backs up at most (each costs it a digest per interval),
    #: and at most from one physical peer: a peer has one virtual peer per credential it
    #: holds in a tree (``peer run --max-credentials``, 4 by default), and its relays ask
    #: for no backup.
    max_watchers: int = 32
    max_watchers_per_peer: int = 4
    #: Recent events a peer keeps to serve pulls, and ids it remembers per link.
    repair_memory: int = 256
    #: Most events one digest lists (the newest), and so most route tests it costs the
    #: receiver; at most 256.
    digest_entries: int = 128
    #: Every subscriber virtual peer keeps a *second path* for what it should get, from
    #: parents on other physical peers, found by its own join searches from directory
    #: contacts (a parent names none, except where a leaving one hands its child over).
    #: Under OHF a second parent, which forwards by the same OHF rule: each event comes
    #: down two paths, and what the second parent learns is what any OHF parent learns
    #: (containment). Under MCR each fine token is dealt to two parents (see
    #: :mod:`overlay.deals`): with ``2k`` parents for ``k`` fine tokens each holds one;
    #: with two parents, each holds all ``k`` (the whole credential, see docs/scheme.md's
    #: known limits). None: on under both routings (see :attr:`pushes_backup`).
    push_backup: bool | None = None
    #: With push backups, a virtual peer whose two parents both drop (under MCR: both
    #: holders of a token) sees no gap (nothing reaches it), so every ``rotate_interval``
    #: seconds (jittered, by the clock alone, never by what arrived) a virtual peer that
    #: wants two parents and has them (under MCR: one with a single fine token) searches
    #: a third and then lets go of the old one with the least proof of delivery (never
    #: the root). 0: never.
    rotate_interval: float = 10.0
    #: Demotion: a parent that missed ``demote_after`` of the last ``demote_window`` events
    #: it owed this virtual peer (events this physical peer got by another path, whose value
    #: lies in the virtual peer's credential, and that the parent had not sent
    #: ``gap_wait`` seconds after) is detached and replaced; its peer's acceptances are
    #: refused for ``shun_period`` seconds. ``demote_after = 0`` turns demotion off.
    demote_after: int = 3
    demote_window: int = 16
    gap_wait: float = 2.0
    shun_period: float = 60.0

    def __post_init__(self) -> None:
        if self.max_children < 1:
            raise OverlayConfigError("max_children must be at least 1")
        if self.routing not in ("ohf", "mcr"):
            raise OverlayConfigError(f"routing must be 'ohf' or 'mcr', not {self.routing!r}")
        if self.hop_limit < 1 or self.dedup_capacity < 16 or self.max_relays < 0:
            raise OverlayConfigError(
                "hop_limit must be >= 1, dedup_capacity >= 16, max_relays >= 0")
        if self.recruit_rounds < 0 or self.recruit_interval <= 0 or self.recruit_sample < 1:
            raise OverlayConfigError("recruit_rounds must be >= 0, recruit_interval > 0 and "
                                     "recruit_sample >= 1")
        if (self.backups < 1 or self.digest_interval <= 0 or self.max_watchers < 0
                or self.repair_memory < 16 or not 1 <= self.digest_entries <= 256):
            raise OverlayConfigError(
                "backups must be >= 1, digest_interval > 0, max_watchers >= 0, "
                "repair_memory >= 16 and digest_entries in [1, 256]")
        if self.leave_linger < 0:
            raise OverlayConfigError("leave_linger must be >= 0")
        if self.max_watchers_per_peer < 1:
            raise OverlayConfigError("max_watchers_per_peer must be >= 1")
        if (not 0 <= self.demote_after <= self.demote_window or self.gap_wait <= 0
                or self.shun_period < 0 or self.rotate_interval < 0):
            raise OverlayConfigError("demote_after must be in [0, demote_window], gap_wait > 0, "
                                     "shun_period >= 0 and rotate_interval >= 0")

    @property
    def repairs(self) -> bool:
        """Whether subscribers ask for backups: ``repair`` if set, else only under MCR. A
        hostile backup can learn a watcher's exact credential (it lists forged entries and
        sees which it pulls); under MCR a parent learns that much from the fine tokens
        anyway, under OHF it would be a new leak."""
        return self.routing == "mcr" if self.repair is None else self.repair

    @property
    def pushes_backup(self) -> bool:
        """Whether subscriber virtual peers keep a second path: ``push_backup`` if set,
        else on."""
        return self.push_backup is not False

    @property
    def token_holders(self) -> int:
        """MCR: the parents each fine token is dealt to."""
        return 2 if self.pushes_backup else 1
