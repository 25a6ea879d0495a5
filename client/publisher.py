"""An application's publisher: enrols for its advertisement, then encrypts each event off the
event loop and hands it to the root of every attribute tree, waiting while the roots are
slow to take what was sent.

Encryption (tens of milliseconds of pairings) runs in a worker thread, so the event loop
stays free for the transport and the application: mcl is called through ctypes, which
releases the GIL. One thread, although two would encrypt faster on idle cores, because a
stream's state and the public parameters' caches are not made for concurrent use, and one
keeps the events in the order they were published.

Keys last an epoch: the first ``publish`` after the rollover enrols again for the new
epoch's keys (and link certificate), once the events under way are encrypted; until that
succeeds, the old keys serve until the end of their grace window (a stream's, until the end
of their epoch). A key server that is down (restarting) when the old keys can serve no
more is waited for, up to ``server_wait`` seconds: ``publish`` waits, as it does for slow
roots, rather than fail because the rollover met a restart.

Back-pressure, so that memory stays bounded and the transport never drops: at most
``max_in_flight`` events are between ``publish`` being called and their frames being
queued (more calls wait for a slot), and an event's frames are queued only once the
transport's send queues hold at most ``max_queued`` frames with them (the transport drops
the oldest frame beyond its own limit; the client never lets it come to that).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ibe_pubsub.client.config import identity_token, server_trust
from ibe_pubsub.client.events import EventIds, Value
from ibe_pubsub.client.exceptions import (
    ConfigError,
    ConnectError,
    PublishRefused,
    SendFailed,
    wrapped,
)
from ibe_pubsub.credentials import Event, Schema, StreamWindow
from ibe_pubsub.peer import EventPublisher, KnownServers, ThresholdAccess, check_body_size

log = logging.getLogger(__name__)

#: Events at most between ``publish`` and the send queues.
MAX_IN_FLIGHT = 64
#: Frames at most in the transport's send queues (an event is one frame per root process).
MAX_QUEUED = 256
#: Seconds between looks at the send queues while they are full.
ROOM_POLL = 0.005
#: Seconds before enrolling for the new epoch's keys is tried again.
RENEW_RETRY = 2.0
#: Seconds ``publish`` waits at most for a key server that is down when the keys must be
#: renewed (the default of ``server_wait``, as a peer's ``--server-wait``).
SERVER_WAIT = 30.0
#: Seconds before a stream's keys expire when it stops encrypting with them (an event
#: checked just before would be encrypted just after).
STREAM_MARGIN = 0.5


class Publisher:
    """Publishes events inside its advertisement; make one with :meth:`connect`."""

    def __init__(self, publisher: EventPublisher, max_in_flight: int = MAX_IN_FLIGHT,
                 max_queued: int = MAX_QUEUED, server_wait: float = SERVER_WAIT) -> None:
        self.event_publisher = publisher
        self.server_wait = server_wait
        self.ids = EventIds()
        self.max_in_flight = max_in_flight
        #: Events taken by ``publish`` and not yet queued (at most ``max_in_flight``).
        self.in_flight = 0
        frames = publisher.frames_per_event
        self.max_queued = min(max(max_queued, frames), publisher.transport.queue_limit)
        self._slots = asyncio.Semaphore(max_in_flight)
        #: Events handed to the worker and not yet encrypted.
        self._encrypting = 0
        #: Cleared while the keys are renewed: nothing is handed to the worker meanwhile.
        self._keys_ready = asyncio.Event()
        self._keys_ready.set()
        self._renew_after = 0.0
        self._sending = asyncio.Lock()
        self._worker = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="ibe-pubsub-encrypt")
        #: A token per event handed to the worker and not yet started on: the worker
        #: prepares a stream's next header only while this is empty (deque operations are
        #: atomic across threads).
        self._waiting: deque[None] = deque()
        #: Whether a preparation is queued or running (touched by the worker only).
        self._preparing = False
        self._loop = asyncio.get_running_loop()
        self._closed = False

    @classmethod
    async def connect(cls, server: str | ThresholdAccess, token: str | None = None,
                      advertisement: str | None = None, *, bundle: str | None = None,
                      server_key: bytes | str | None = None,
                      known_servers: str | Path | KnownServers | None = None,
                      ca_file: str | None = None, insecure_transport: bool = False,
                      stream_window: float | None = None, stream_max_events: int | None = None,
                      root_timeout: float = 30.0, max_in_flight: int = MAX_IN_FLIGHT,
                      max_queued: int = MAX_QUEUED, server_wait: float = SERVER_WAIT
                      ) -> Publisher:
        """Enrol for ``advertisement`` (``""``: everything the identity may publish; or take
        the keys of ``bundle``) and find the root of every tree (waiting up to
        ``root_timeout`` s); ConnectError if refused. With ``stream_window`` (seconds),
        events go out as a stream (see ``publish --stream-window``). ``server_wait``: how
        long ``publish`` waits for a key server that is down when new keys are needed.
        ``server`` may be a threshold deployment (``ThresholdAccess(public_document,
        access_file)``): then no token is given, and the keys are combined from its
        members."""
        if advertisement is None and bundle is None:
            raise ConfigError("an advertisement (or a bundle) is required")
        if isinstance(server, ThresholdAccess):
            keys: dict[str, Any] = {"server": None, "token": "", "threshold": server}
        else:
            pinned, known = server_trust(server_key, known_servers)
            keys = {"server": server, "token": identity_token(token, bundle),
                    "server_key": pinned, "known_servers": known}
        with wrapped(ConnectError):
            window = (StreamWindow(stream_window, stream_max_events)
                      if stream_window is not None else None)
            publisher = EventPublisher(advertisement=advertisement, ca_file=ca_file,
                                       insecure_transport=insecure_transport, bundle=bundle,
                                       stream_window=window, **keys)
        try:
            with wrapped(ConnectError):
                await publisher.start(root_timeout)
        except BaseException:
            await publisher.close(0)
            raise
        return cls(publisher, max_in_flight, max_queued, server_wait)

    @property
    def schema(self) -> Schema:
        return self.event_publisher.service.pp.schema

    @property
    def advertisement(self) -> str:
        """What this publisher may publish, as a predicate (``""``: everything)."""
        return str(self.event_publisher.advertisement)

    @property
    def sent(self) -> int:
        """Events queued for the roots."""
        return self.event_publisher.sent

    @property
    def queued(self) -> int:
        """Frames in the send queues, not yet written to a root's connection."""
        return self.event_publisher.transport.queued()

    @property
    def dropped(self) -> int:
        """Frames the transport dropped (a root it gave up on); 0 while all goes well."""
        return self.event_publisher.transport.dropped

    async def publish(self, values: Mapping[str, Value], body: bytes | str = b"",
                      event_id: str | None = None) -> str:
        """Encrypt and sign an event (a value for every attribute of the schema; ``body``
        text is sent as UTF-8) and queue it for every root; returns its id, made up unless
        given. Waits while ``max_in_flight`` events are under way or the send queues are
        full. PublishRefused, with nothing sent, for values the schema refuses, outside
        the advertisement, or a body too large to be sent (``peer.events_io.MAX_BODY``)."""
        if self._closed:
            raise PublishRefused("the publisher is closed")
        event_id = event_id or self.ids.next()
        with wrapped(PublishRefused):
            event = Event(event_id, self.schema.validate_values(values),
                          body.encode() if isinstance(body, str) else body)
            check_body_size(event.body, f"event {event_id!r}")
        await self._slots.acquire()
        self.in_flight += 1
        try:
            await self._current_keys()
        except BaseException:
            self._free_slot()
            raise
        self._encrypting += 1
        self._waiting.append(None)
        encrypted = self._worker.submit(self._encrypt, event)
        encrypted.add_done_callback(self._worker_done)
        try:
            with wrapped(PublishRefused):
                ciphertext = await asyncio.wrap_future(encrypted)
            async with self._sending:  # in order, one at a time
                await self._room()
                self.event_publisher.send(ciphertext)
        finally:
            # The slot is free once the worker is done with the event, even if the caller
            # gave up waiting for it.
            encrypted.add_done_callback(self._release)
        return event_id

    async def _current_keys(self) -> None:
        """Keys of the current epoch: after the rollover, enrol again once the worker is
        idle. PublishRefused once the old keys can serve no more (see :meth:`_usable`)
        without new ones, since every peer would drop what they encrypt."""
        while not self._keys_ready.is_set():
            await self._keys_ready.wait()
        keys = self.event_publisher.keys
        assert keys is not None
        await self._stream_rollover(keys.epoch_end)
        if time.time() >= max(keys.epoch_end, self._renew_after):
            self._keys_ready.clear()
            try:
                while self._encrypting:
                    await asyncio.sleep(ROOM_POLL)
                await self._renew()
            finally:
                self._keys_ready.set()
            keys = self.event_publisher.keys
            assert keys is not None
        if not self._usable():
            raise PublishRefused(f"the publisher's keys of epoch {keys.epoch} have expired "
                                 "and no new ones could be had")

    async def _renew(self) -> None:
        """Enrol for the new epoch's keys. While the key server is down (it refuses
        connections or answers 502/503/504) or still in the old epoch, and the old keys can
        serve no more, try again every RENEW_RETRY s, for up to ``server_wait`` s in all."""
        give_up = time.monotonic() + self.server_wait
        while True:
            if self._closed:  # its key server client is closed too
                raise PublishRefused("the publisher was closed while it waited for new keys")
            refused, why = False, "the key server is still in the old epoch"
            try:
                with wrapped(PublishRefused):
                    await self.event_publisher.enrol()
            except PublishRefused as exc:
                refused = not getattr(exc.__cause__, "down", False)
                why = str(exc)
            keys = self.event_publisher.keys
            assert keys is not None
            if time.time() < keys.epoch_end:
                return
            self._renew_after = time.time() + RENEW_RETRY
            if refused or self._usable() or time.monotonic() + RENEW_RETRY > give_up:
                log.warning("could not get the new epoch's publisher keys: %s", why)
                return
            log.warning("could not get the new epoch's publisher keys yet (%s): publish waits, "
                        "trying again every %.0f s for %.0f s more at most", why, RENEW_RETRY,
                        give_up - time.monotonic())
            await asyncio.sleep(RENEW_RETRY)

    def _usable(self) -> bool:
        """Whether the current keys may still encrypt: a stream's until its session
        certificates expire (the end of the epoch, less STREAM_MARGIN), others until the
        end of the grace window after their epoch."""
        keys = self.event_publisher.keys
        assert keys is not None
        stream = self.event_publisher.stream
        if stream is not None:
            return time.time() < stream.expires_at - STREAM_MARGIN
        return time.time() < keys.epoch_end + self.event_publisher.service.grace

    async def _stream_rollover(self, epoch_end: float) -> None:
        """A stream publishes nothing once its session certificates expire, at the epoch's
        end in whole seconds, and no grace window follows: close to it, wait for the end of
        the epoch (a second at most), when new keys can be had, rather than be refused."""
        stream = self.event_publisher.stream
        if stream is not None and time.time() >= stream.expires_at - STREAM_MARGIN:
            self._keys_ready.clear()
            try:
                await asyncio.sleep(max(0.0, epoch_end - time.time()))
            finally:
                self._keys_ready.set()

    async def _room(self) -> None:
        """Until one more event's frames fit within ``max_queued``."""
        frames = self.event_publisher.frames_per_event
        while self.queued + frames > self.max_queued:
            if self._closed:
                raise PublishRefused("the publisher was closed before the event was sent")
            await asyncio.sleep(ROOM_POLL)

    def _encrypt(self, event: Event) -> bytes:
        """In the worker: ``event`` encrypted; then, if no other event waits, a stream's
        next header is prepared behind it, so that the window's renewal costs no event its
        tens of milliseconds."""
        self._waiting.popleft()
        try:
            return self.event_publisher.encrypt(event)
        finally:
            if (not self._waiting and not self._preparing
                    and self.event_publisher.stream is not None):
                self._preparing = True
                try:
                    self._worker.submit(self._prepare)
                except RuntimeError:  # closed meanwhile
                    self._preparing = False

    def _prepare(self) -> None:
        try:
            self.event_publisher.prepare(lambda: bool(self._waiting))
        except Exception:
            log.exception("preparing the stream's next header failed")
        finally:
            self._preparing = False

    def _worker_done(self, job: concurrent.futures.Future[bytes]) -> None:
        if job.cancelled():  # never started: its token is still waiting
            self._waiting.popleft()
        self._loop.call_soon_threadsafe(self._count_encrypted)

    def _count_encrypted(self) -> None:
        self._encrypting -= 1

    def _release(self, _: concurrent.futures.Future[bytes]) -> None:
        self._loop.call_soon_threadsafe(self._free_slot)

    def _free_slot(self) -> None:
        self.in_flight -= 1
        self._slots.release()

    async def close(self, flush_timeout: float = 10.0) -> None:
        """Hand what is queued to the roots (within ``flush_timeout`` s) and disconnect;
        SendFailed if some of it could not be."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._worker.shutdown)
        if not await self.event_publisher.close(flush_timeout):
            raise SendFailed(f"some events could not be handed to a root ({self.dropped} "
                             f"frame(s) dropped, {self.queued} unsent)")

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            await self.close()
        except SendFailed as exc:
            if exc_type is None:
                raise
            log.warning("%s", exc)  # the error that ended the block is the one to see
