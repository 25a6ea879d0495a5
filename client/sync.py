"""The blocking facade, for scripts and notebooks: the same subscriber and publisher, each
running on an event loop of its own in a background thread.

Callbacks given to a synchronous subscriber run in that thread, not the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ibe_pubsub.client import publisher, subscriber
from ibe_pubsub.client.events import Delivery, Value
from ibe_pubsub.client.exceptions import PublishRefused, ReceiveTimeout, SubscriberClosed
from ibe_pubsub.client.loop_thread import LoopThread
from ibe_pubsub.credentials import Schema
from ibe_pubsub.peer import ThresholdAccess


class Subscriber:
    """A blocking :class:`client.subscriber.Subscriber`; make one with :meth:`connect`."""

    def __init__(self, thread: LoopThread, inner: subscriber.Subscriber) -> None:
        self._thread = thread
        self.inner = inner

    @classmethod
    def connect(cls, server: str | ThresholdAccess, token: str | None = None,
                subscription: str | None = None, listen: str = "127.0.0.1:0",
                **options: Any) -> Subscriber:
        """As the asynchronous ``Subscriber.connect`` (same arguments), blocking until
        joined."""
        thread = LoopThread("ibe-pubsub-subscriber")
        try:
            inner = thread.run(subscriber.Subscriber.connect(server, token, subscription,
                                                             listen, **options))
        except BaseException:
            thread.stop()
            raise
        return cls(thread, inner)

    @property
    def address(self) -> str:
        return self.inner.address

    @property
    def dropped(self) -> int:
        return self.inner.dropped

    def next(self, timeout: float | None = None) -> Delivery:
        """The next event; ReceiveTimeout if none within ``timeout`` seconds (None: no
        limit), SubscriberClosed once closed and drained."""
        if self._thread.stopped:
            raise SubscriberClosed("the subscriber is closed")
        return self._thread.run(self.inner.next(timeout))

    def __iter__(self) -> Iterator[Delivery]:
        """Events until the subscriber is closed."""
        return self.events()

    def events(self, timeout: float | None = None) -> Iterator[Delivery]:
        """Events until none came for ``timeout`` seconds (None: until closed)."""
        while True:
            try:
                yield self.next(timeout)
            except (ReceiveTimeout, SubscriberClosed):
                return

    def on_event(self, callback: Callable[[Delivery], None]) -> None:
        """Call ``callback(delivery)`` for every event, in the background thread."""
        self._thread.run(_call(self.inner.on_event, callback))

    def close(self) -> None:
        """Leave gracefully and stop the background thread."""
        if self._thread.stopped:
            return
        try:
            self._thread.run(self.inner.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Publisher:
    """A blocking :class:`client.publisher.Publisher`; make one with :meth:`connect`."""

    def __init__(self, thread: LoopThread, inner: publisher.Publisher) -> None:
        self._thread = thread
        self.inner = inner

    @classmethod
    def connect(cls, server: str | ThresholdAccess, token: str | None = None,
                advertisement: str | None = None, **options: Any) -> Publisher:
        """As the asynchronous ``Publisher.connect`` (same arguments), blocking."""
        thread = LoopThread("ibe-pubsub-publisher")
        try:
            inner = thread.run(publisher.Publisher.connect(server, token, advertisement,
                                                           **options))
        except BaseException:
            thread.stop()
            raise
        return cls(thread, inner)

    @property
    def schema(self) -> Schema:
        return self.inner.schema

    @property
    def sent(self) -> int:
        return self.inner.sent

    def publish(self, values: Mapping[str, Value], body: bytes | str = b"",
                event_id: str | None = None) -> str:
        """As the asynchronous ``publish``, blocking until the event is queued."""
        if self._thread.stopped:
            raise PublishRefused("the publisher is closed")
        return self._thread.run(self.inner.publish(values, body, event_id))

    def close(self, flush_timeout: float = 10.0) -> None:
        """Hand what is queued to the roots, disconnect and stop the background thread;
        SendFailed if some of it could not be handed over."""
        if self._thread.stopped:
            return
        try:
            self._thread.run(self.inner.close(flush_timeout))
        finally:
            self._thread.stop()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _call(function: Callable[..., None], *args: Any) -> None:
    """Call a plain function on the loop's thread (it needs the running loop)."""
    function(*args)
