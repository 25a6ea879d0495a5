"""What the state machine asks its driver to do: send, deliver, log, and report links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ibe_pubsub.credentials import Event
from ibe_pubsub.overlay.wire import Message, Publish, coalesced


@dataclass(frozen=True)
class Send:
    """Send ``message`` to the physical peer at address ``to``."""

    to: str
    message: Message


@dataclass(frozen=True)
class Deliver:
    """Hand a verified, decrypted event that matches the exact subscription to the application."""

    event: Event
    at: float
    #: The epoch whose keys it was encrypted for.
    epoch: int
    #: Whether it came as a stream event (a reused header), not a version-2 event.
    stream: bool


@dataclass(frozen=True)
class Log:
    """A log line (``level`` is a logging level name: debug, info, warning)."""

    level: str
    text: str


@dataclass(frozen=True)
class Connected:
    """A virtual peer gained a parent link (``link`` counts its parents, 1 = first)."""

    attribute: str
    vp: str
    parent: str
    link: int
    started_at: float
    at: float


Action = Send | Deliver | Log | Connected


def publication(event: bytes, roots: Mapping[str, str]) -> list[Send]:
    """An encrypted event sent to the root of every attribute tree (``roots``: attribute ->
    address), where it enters each tree; the publisher is no virtual peer, so it names none."""
    return [Send(address, Publish("", "", attribute, event))
            for attribute, address in roots.items()]


def coalesce(actions: list[Action]) -> list[Action]:
    """The copies of one event sent to one physical peer (for its virtual peers in several
    trees) as one message, at the place of the first copy: a root sends each subscriber
    one frame an event, not one a tree. A message to that peer other than the event closes
    the group, so that every link keeps the order of what it carries."""
    if sum(isinstance(a, Send) and isinstance(a.message, Publish) for a in actions) < 2:
        return actions
    out: list[Action | tuple[str, list[Publish]]] = []
    groups: dict[tuple[str, bytes], list[Publish]] = {}
    for action in actions:
        if isinstance(action, Send) and isinstance(action.message, Publish):
            key = (action.to, action.message.event)  # a bytes object hashes once
            group = groups.get(key)
            if group is None:
                group = groups[key] = []
                out.append((action.to, group))
            group.append(action.message)
            continue
        if isinstance(action, Send):
            for key in [k for k in groups if k[0] == action.to]:
                del groups[key]
        out.append(action)
    return [merged for a in out for merged in (
        [Send(a[0], m) for m in coalesced(a[1])] if isinstance(a, tuple) else [a])]
