"""The lifecycle of one virtual peer, in the style of h11's ``_state.py``.

A virtual peer's state is not stored: it is read off its links
(:attr:`VirtualPeer.state <overlay.virtual.VirtualPeer.state>`), so it can never
disagree with them. The machine tests the state, not the fields, where it asks
which of these a virtual peer is in.

=========  ==============================================  =========
state      event                                           new state
=========  ==============================================  =========
DETACHED   ``join()`` (a subscriber's virtual peer), or    JOINING
           ``rekey()`` with a kit for a new credential:
           a ``Join`` goes to a directory contact
JOINING    tick: no acceptance within ``join_timeout``     JOINING
           (retry with a new join id; after twice that,
           ask where a swap offer pointed to split)
JOINING    ``Accept`` with a valid proof (also the one a   ATTACHED
           swap's old parent sends after ``SwapHandover``)
ATTACHED   tick: the last parent silent for                JOINING
           ``failure_timeout``; ``Pong`` not ok from it;
           ``Handover`` from it naming another peer (or
           none): the ``Join`` goes out at once
ATTACHED   ``Handover`` to a relay of the same peer;       ATTACHED
           ``SwapAccept`` (the newcomer replaces the
           parent); MCR: further ``Accept``\\ s up to one
           parent per fine token (two with push
           backups), and losing a parent while others
           remain; OHF: tick ``failure_timeout`` after
           the root's peer accepted it (its other
           parents are let go)
any        ``leave()``: children handed to a parent,       DETACHED
           links dropped, the machine stopped
=========  ==============================================  =========

There is no *leaving* state: a graceful leave is one step, after which the machine
takes no message and no tick. The top of a tree (a root's own virtual peer) is
ATTACHED from the start and never moves; a relay is born ATTACHED below the virtual
peer it copies, on the same physical peer, whose link cannot fail apart.
"""

from __future__ import annotations

from enum import Enum


class Lifecycle(Enum):
    """Where a virtual peer is in its tree."""

    #: No parent and no join under way: before :meth:`join`, and after :meth:`leave`.
    DETACHED = "detached"
    #: No parent yet, a join under way (``join_started`` is set).
    JOINING = "joining"
    #: At least one parent, or the tree's top: events reach it, joins may pass through it.
    ATTACHED = "attached"
