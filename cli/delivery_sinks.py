"""Where ``peer run`` writes its deliveries, each as one JSON line: a file or stdout, the stdin
of a command, the readers of a Unix socket.

A slow consumer must never stall the peer, whose event loop also keeps its links and
trees: nothing here waits for a consumer. The command's pipe and each socket reader have
a bounded buffer; a delivery that does not fit in the command's is dropped (and counted),
a socket reader that falls that far behind is disconnected (readers come and go). A
consumer that is gone for good (the command exited, stdout was closed) stops the peer
with one line saying so, rather than dropping every later delivery unseen: a service
manager restarts the whole feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ibe_pubsub.cli.exceptions import CliError

if TYPE_CHECKING:
    from ibe_pubsub.credentials import Event
    from ibe_pubsub.peer import EventWriter

log = logging.getLogger(__name__)

#: Bytes of deliveries a consumer may leave unread (``--deliver-buffer``'s default).
BUFFER = 1 << 20
#: Seconds the command may take to finish once its input ended, before it is terminated.
COMMAND_EXIT = 10.0
#: Seconds, once the command's input closed, to see whether it exited (to tell its status).
PIPE_EXIT = 0.2


class Sink(Protocol):
    name: str

    async def start(self, failed: Failure) -> None:
        """Be ready for deliveries; a consumer gone for good calls ``failed``."""

    def write_line(self, line: str) -> None:
        """Take one delivery without waiting (OSError: the consumer is gone)."""

    async def close(self) -> None:
        """Hand over what is buffered and let go of the consumer."""


@dataclass
class Failure:
    """Why deliveries cannot go on (the first reason stands); ``event`` is set then."""

    why: str | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, why: str) -> None:
        if self.why is None:
            self.why = why
            self.event.set()


@dataclass
class Deliveries:
    """Writes every delivery, as the same JSON line, to every sink."""

    sinks: list[Sink]
    failure: Failure = field(default_factory=Failure)

    async def start(self) -> None:
        """SinkError if one cannot be set up (those set up before are closed then)."""
        for started, sink in enumerate(self.sinks):
            try:
                await sink.start(self.failure)
            except (SinkError, OSError) as exc:
                self.sinks = self.sinks[:started]
                if isinstance(exc, SinkError):
                    raise
                raise SinkError(f"cannot start {sink.name}: {exc.strerror or exc}") from exc

    def deliver(self, event: Event) -> None:
        from ibe_pubsub.peer import EventWriter

        line = EventWriter.line(event, time.time())
        for sink in list(self.sinks):
            try:
                sink.write_line(line)
            except OSError as exc:
                self.sinks.remove(sink)
                self.failure(f"cannot write deliveries to {sink.name}: {exc.strerror or exc}")

    async def close(self) -> None:
        for sink in self.sinks:
            await sink.close()


@dataclass
class FileSink:
    """A file (appended to) or stdout, through :class:`peer.EventWriter`."""

    writer: EventWriter
    name: str

    async def start(self, failed: Failure) -> None:
        pass

    def write_line(self, line: str) -> None:
        self.writer.write_line(line)

    async def close(self) -> None:
        with contextlib.suppress(OSError):  # stdout closed: nothing left to flush to
            self.writer.close()


@dataclass
class CommandSink:
    """One run of a shell command reading a JSON line per delivery on its stdin. It runs in
    a session of its own, so Ctrl-C reaches the peer only and the command reads to the end
    of its input; it exiting before the peer stops the peer."""

    command: str
    buffer: int = BUFFER
    dropped: int = 0
    _process: asyncio.subprocess.Process | None = None
    _watcher: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"the command {self.command!r}"

    async def start(self, failed: Failure) -> None:
        self._process = await asyncio.create_subprocess_shell(
            self.command, stdin=asyncio.subprocess.PIPE, start_new_session=True)
        self._watcher = asyncio.get_running_loop().create_task(self._watch(failed))

    async def _watch(self, failed: Failure) -> None:
        """The command exiting, or closing its input (a broken pipe: every later delivery
        would be lost), fails the deliveries; an exit is told with its status."""
        assert self._process is not None and self._process.stdin is not None
        exited = asyncio.ensure_future(self._process.wait())
        closed = asyncio.ensure_future(self._process.stdin.wait_closed())
        try:
            await asyncio.wait({exited, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():  # an exit closes the pipe too: a moment for its status
                await asyncio.wait({exited}, timeout=PIPE_EXIT)
        finally:
            for waiting in (exited, closed):
                waiting.cancel()
            # A broken pipe's error, if any, is the reason said below.
            await asyncio.gather(exited, closed, return_exceptions=True)
        if not exited.cancelled():
            failed(f"the delivery command {self.command!r} exited with status "
                   f"{exited.result()}")
        else:
            failed(f"the delivery command {self.command!r} closed its input (broken pipe)")

    def write_line(self, line: str) -> None:
        assert self._process is not None and self._process.stdin is not None
        pipe = self._process.stdin
        if self._process.returncode is not None or pipe.transport.is_closing():
            return  # the watcher says so
        if pipe.transport.get_write_buffer_size() + len(line) > self.buffer:
            self.dropped += 1
            if self.dropped % 1000 == 1:  # a line now and then, not one per event
                log.warning("%s is %d bytes behind: dropped a delivery (%d so far)",
                            self.name, self.buffer, self.dropped)
            return
        pipe.write(line.encode())

    async def close(self) -> None:
        """End its input and give it time to finish with it."""
        if self._process is None:
            return
        assert self._watcher is not None and self._process.stdin is not None
        self._watcher.cancel()
        self._process.stdin.close()
        try:
            await asyncio.wait_for(self._process.wait(), COMMAND_EXIT)
        except TimeoutError:
            log.warning("%s did not exit within %g s of its input's end: terminated",
                        self.name, COMMAND_EXIT)
            self._process.terminate()
            await self._process.wait()


@dataclass
class SocketSink:
    """A Unix stream socket at ``path``: every connected reader gets every delivery from
    its connection on. The socket is made accessible to this user only (the lines are
    decrypted events); a reader more than ``buffer`` bytes behind is disconnected."""

    path: Path
    buffer: int = BUFFER
    _server: asyncio.AbstractServer | None = None
    _readers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"the socket {self.path}"

    async def start(self, failed: Failure) -> None:
        listener = _listening_socket(self.path)
        self._server = await asyncio.start_unix_server(self._serve, sock=listener)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hold one reader's connection until it closes it (anything it sends is ignored)."""
        sock = writer.get_extra_info("socket")
        if sock is not None:  # the kernel's buffer bounded as well as ours
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffer)
        self._readers.add(writer)
        log.info("a reader connected to %s (%d now)", self.name, len(self._readers))
        try:
            with contextlib.suppress(OSError):
                while await reader.read(4096):
                    pass
        finally:
            self._drop(writer)

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        if writer in self._readers:
            self._readers.discard(writer)
            writer.transport.abort()

    def write_line(self, line: str) -> None:
        data = line.encode()
        for writer in list(self._readers):
            if writer.is_closing():
                self._drop(writer)
            elif writer.transport.get_write_buffer_size() + len(data) > self.buffer:
                log.warning("dropped a reader of %s: more than %d bytes of deliveries "
                            "unread", self.name, self.buffer)
                self._drop(writer)
            else:
                writer.write(data)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._readers):
            writer.close()  # what is buffered is still written
            self._readers.discard(writer)
        await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class SinkError(CliError):
    """A delivery destination cannot be set up (the message says why)."""


def _listening_socket(path: Path) -> socket.socket:
    """A Unix stream socket bound at ``path`` with mode 0600 from the start (a umask, not a
    chmod after the bind, which would leave a moment for another user to connect); a stale
    socket file there is replaced, a live one (another peer's) or another file refused."""
    if path.is_symlink():  # not followed: the socket would be made or removed elsewhere
        raise SinkError(f"{path} is a symbolic link: give the socket's own path")
    if path.exists():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SinkError(f"{path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # nobody listens there any more
            else:
                raise SinkError(f"another process listens on {path}")
    listener = socket.socket(socket.AF_UNIX)
    mask = os.umask(0o177)
    try:
        listener.bind(str(path))
    except OSError as exc:
        listener.close()
        raise SinkError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    finally:
        os.umask(mask)
    listener.listen()
    listener.setblocking(False)
    return listener
