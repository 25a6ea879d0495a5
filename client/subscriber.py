"""An application's subscriber: a peer that enrols for its subscription, joins the attribute
trees and hands over each event it delivers, by iteration or to callbacks.

It is a :class:`peer.PeerNode` run on the caller's event loop: key refresh before each
epoch rollover and tree repair happen inside, unseen. Delivered events wait in a buffer of
``max_pending`` until taken; beyond it the oldest is dropped (counted in ``dropped``) so an
application that stops reading cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from ibe_pubsub.client.config import identity_token, server_trust
from ibe_pubsub.client.events import Delivery
from ibe_pubsub.client.exceptions import (
    ClientError,
    ConnectError,
    ConnectTimeout,
    ReceiveTimeout,
    SubscriberClosed,
    SubscriberFailed,
    wrapped,
)
from ibe_pubsub.overlay import Deliver
from ibe_pubsub.peer import KnownServers, NodeOptions, PeerNode, ThresholdAccess

log = logging.getLogger(__name__)

EventCallback = Callable[[Delivery], Awaitable[None] | None]
#: Delivered events kept until the application takes them.
MAX_PENDING = 10_000
_END = object()


class Subscriber:
    """Receives the events that match its subscription; make one with :meth:`connect`."""

    def __init__(self, node: PeerNode, max_pending: int = MAX_PENDING) -> None:
        self.node = node
        self.max_pending = max_pending
        #: Events dropped because the application left more than ``max_pending`` untaken.
        self.dropped = 0
        self._pending: asyncio.Queue[Delivery | object] = asyncio.Queue()
        #: Why no more events come (the error ``next`` raises once drained); None meanwhile.
        self._end: tuple[type[ClientError], str] | None = None
        self._callbacks: list[EventCallback] = []
        self._dispatcher: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False
        node.on_deliver(self._delivered)

    @classmethod
    async def connect(cls, server: str | ThresholdAccess, token: str | None = None,
                      subscription: str | None = None, listen: str = "127.0.0.1:0", *,
                      bundle: str | None = None, server_key: bytes | str | None = None,
                      known_servers: str | Path | KnownServers | None = None,
                      ca_file: str | None = None, insecure_transport: bool = False,
                      on_event: EventCallback | None = None, ready_timeout: float = 60.0,
                      max_pending: int = MAX_PENDING, **node_options: Any) -> Subscriber:
        """Enrol for ``subscription`` (or take the keys of ``bundle``), listen on ``listen``
        (an address other peers can dial) and join; returns once joined, or raises
        ConnectTimeout after ``ready_timeout`` seconds, ConnectError if refused.
        ``node_options``: more fields of :class:`peer.NodeOptions` (``http``, ``overlay``).
        ``server`` may be a threshold deployment (``ThresholdAccess(public_document,
        access_file)``): then no token is given, and the keys are combined from its
        members."""
        if isinstance(server, ThresholdAccess):
            keys: dict[str, Any] = {"threshold": server}
        else:
            pinned, known = server_trust(server_key, known_servers)
            keys = {"server": server, "token": identity_token(token, bundle),
                    "server_key": pinned, "known_servers": known}
        with wrapped(ConnectError):
            node = PeerNode(NodeOptions(
                listen=listen, subscribe=subscription, bundle=bundle, ca_file=ca_file,
                insecure_transport=insecure_transport, **keys, **node_options))
        subscriber = cls(node, max_pending)
        try:
            with wrapped(ConnectError):
                await asyncio.wait_for(subscriber._join(), ready_timeout)
        except TimeoutError:
            await node.stop()
            raise ConnectTimeout(f"the subscriber did not join within {ready_timeout:g} s: "
                                 f"{subscriber._joining()}") from None
        except BaseException:
            await node.stop()
            raise
        subscriber._watcher = asyncio.get_running_loop().create_task(subscriber._watch())
        if on_event is not None:
            subscriber.on_event(on_event)
        return subscriber

    async def _join(self) -> None:
        await self.node.start()
        await self.node.ready.wait()

    def _joining(self) -> str:
        """What the join still waits for."""
        trees = self.node.health()["trees"]
        if not trees:
            return f"no keys from {self.node.service.where} yet"
        assert isinstance(trees, dict)
        return f"not attached in tree(s) {', '.join(t for t, ok in trees.items() if not ok)}"

    @property
    def address(self) -> str:
        """Where this peer listens (``host:port``)."""
        return self.node.address

    # -- taking events ---------------------------------------------------------------------

    async def next(self, timeout: float | None = None) -> Delivery:
        """The next event; ReceiveTimeout if none within ``timeout`` seconds (None: no
        limit), SubscriberClosed once closed and drained, SubscriberFailed if it failed."""
        try:
            item = await asyncio.wait_for(self._pending.get(), timeout)
        except TimeoutError:
            raise ReceiveTimeout(f"no event within {timeout:g} s") from None
        if item is _END:
            self._pending.put_nowait(_END)  # for the next caller too
            assert self._end is not None
            kind, message = self._end
            raise kind(message)
        assert isinstance(item, Delivery)
        return item

    async def __aiter__(self) -> AsyncIterator[Delivery]:
        """Events until the subscriber is closed (SubscriberFailed if it fails)."""
        while True:
            try:
                yield await self.next()
            except SubscriberClosed:
                return

    def on_event(self, callback: EventCallback) -> None:
        """Call ``callback(delivery)`` (a function or a coroutine function) for every event,
        one at a time in order. Events go to the callbacks instead of to iteration."""
        self._callbacks.append(callback)
        if self._dispatcher is None:
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        try:
            async for delivery in self:
                for callback in list(self._callbacks):
                    try:
                        result = callback(delivery)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:
                        log.exception("event callback failed on event %s", delivery.id)
        except SubscriberFailed as exc:  # no caller to raise it to
            log.error("%s", exc)

    def _delivered(self, delivery: Deliver) -> None:
        if self._pending.qsize() >= self.max_pending:
            self._pending.get_nowait()
            self.dropped += 1
            if self.dropped % 1000 == 1:  # a line now and then, not one per event
                log.warning("%d events untaken: dropped the oldest (%d so far)",
                            self.max_pending, self.dropped)
        self._pending.put_nowait(Delivery.of(delivery, time.time()))

    async def _watch(self) -> None:
        await self.node.failed.wait()
        self._finish(SubscriberFailed, self.node.failure or "the subscriber failed")

    def _finish(self, kind: type[ClientError], message: str) -> None:
        """No more events: once the buffer is drained, ``next`` raises ``kind(message)``
        (the first reason given stands)."""
        if self._end is None:
            self._end = (kind, message)
            self._pending.put_nowait(_END)

    # -- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Leave gracefully (children handed over, parents told, the directory entry
        dropped); events already received can still be taken, and go to the callbacks."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
        await self.node.stop()
        self._finish(SubscriberClosed, "the subscriber is closed")
        if self._dispatcher is not None and self._dispatcher is not asyncio.current_task():
            await self._dispatcher

    async def __aenter__(self) -> Subscriber:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
