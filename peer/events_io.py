"""Events as JSON lines: the publisher's input file and the subscriber's delivery output.

A line is ``{"id": str, "values": {attribute: value}, "body": str}``; the body is
UTF-8 text (a delivered body that is not UTF-8 is written as ``body_base64``).
Delivered lines also carry ``delivered_at`` (Unix seconds) so delays can be
measured. Every written line is flushed at once, so a reader tailing the file
sees each delivery as it happens. Input is read and checked line by line, each line
decoded on its own, so that a live feed (stdin, a FIFO) is published as it arrives and a
bad line spoils only itself.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ibe_pubsub.credentials import Event, EventFilter, Schema, SchemaError
from ibe_pubsub.overlay import MAX_FRAME, OverlayConfig
from ibe_pubsub.peer.exceptions import PeerError

MAX_ID = 200
#: The largest body an event may carry: encrypted, with its header and signatures (about
#: 5 KiB for the stocks schema, more for a schema of many attributes), it must fit one
#: overlay message, or every transport refuses it and the event is lost.
MAX_BODY = MAX_FRAME - 256 * 1024
#: The longest line (or broker message) read: a little above the overlay message limit, as
#: no event longer than that fits one; a longer line is read past, never held whole.
MAX_LINE = MAX_FRAME + 64 * 1024
#: Bytes read at a time while reading past an over-long line.
_SKIP_CHUNK = 64 * 1024
#: Ids a reader of events remembers to refuse a repeat: as many as a subscriber does.
REMEMBERED_IDS = OverlayConfig().dedup_capacity


class EventFileError(PeerError, ValueError):
    """A line of an events file is not a valid event (the message names the line)."""


def event_line(event: Event, delivered_at: float | None = None) -> dict[str, Any]:
    """The JSON object of one event."""
    line: dict[str, Any] = {"id": event.event_id, "values": dict(event.values)}
    try:
        line["body"] = event.body.decode("utf-8")
    except UnicodeDecodeError:
        line["body_base64"] = base64.b64encode(event.body).decode()
    if delivered_at is not None:
        line["delivered_at"] = delivered_at
    return line


class EventWriter:
    """Appends one flushed JSON line per delivered event to a file, or to stdout."""

    def __init__(self, path: str | None = None) -> None:
        self._owned = path not in (None, "-")
        # Open for the writer's lifetime (closed by close()), hence no context manager.
        self._out: IO[str] = open(path, "a", encoding="utf-8") if self._owned \
            else sys.stdout  # type: ignore[arg-type]  # noqa: SIM115

    @staticmethod
    def line(event: Event, delivered_at: float) -> str:
        """The JSON line of a delivery, as every destination of deliveries gets it."""
        return json.dumps(event_line(event, delivered_at), sort_keys=True) + "\n"

    def write(self, event: Event, delivered_at: float | None = None) -> None:
        self.write_line(self.line(event, time.time() if delivered_at is None else delivered_at))

    def write_line(self, text: str) -> None:
        """Write one line made by :meth:`line` (OSError, e.g. BrokenPipeError, if the file or
        the reader of stdout is gone)."""
        self._out.write(text)
        self._out.flush()

    def close(self) -> None:
        if self._owned:
            self._out.close()


def parse_event(schema: Schema, obj: Any, where: str) -> Event:
    """One decoded JSON object -> Event, checked against the schema."""
    if not isinstance(obj, dict):
        raise EventFileError(f"{where}: expected a JSON object")
    unknown = set(obj) - {"id", "values", "body"}
    if unknown:
        raise EventFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    event_id, values, body = obj.get("id"), obj.get("values"), obj.get("body", "")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= MAX_ID:
        raise EventFileError(f"{where}: 'id' must be a non-empty string of at most {MAX_ID}")
    if not isinstance(values, dict):
        raise EventFileError(f"{where}: 'values' must be an object")
    if not isinstance(body, str):
        raise EventFileError(f"{where}: 'body' must be a string")
    try:
        checked = schema.validate_values(values)
    except SchemaError as exc:
        raise EventFileError(f"{where}: {exc}") from None
    encoded = body.encode("utf-8")
    check_body_size(encoded, where)
    return Event(event_id, checked, encoded)


def check_body_size(body: bytes, where: str) -> None:
    """EventFileError, naming ``where``, for a body too large to be sent (:data:`MAX_BODY`):
    checked before encryption, as the transport would only drop the event's frames."""
    if len(body) > MAX_BODY:
        raise EventFileError(f"{where}: body of {len(body)} bytes exceeds the limit of "
                             f"{MAX_BODY} (an encrypted event must fit one overlay message)")


def iter_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON) for every non-blank line; '-' reads stdin."""
    for number, raw in _raw_lines(path):
        obj = _decoded(f"{_shown(path)}:{number}", raw)
        if obj is not _BLANK:
            yield number, obj


@dataclass(frozen=True)
class Overlong:
    """A line longer than :data:`MAX_LINE`, read past rather than loaded: only its size."""

    size: int


def _raw_lines(path: str) -> Iterator[tuple[int, bytes | Overlong]]:
    """(line number, bytes) as each line arrives: from a pipe or FIFO a line is yielded as
    soon as it is complete, not when the input ends. A line longer than :data:`MAX_LINE`
    is read past in chunks and yielded as :class:`Overlong`, so memory stays bounded."""
    # stdin through a reader of its own: a read that blocks holds its reader's lock, and
    # the interpreter, shutting down while this runs in a daemon thread, closes sys.stdin
    # (and aborts if that lock is held) but never this reader.
    source: int | Path = os.dup(sys.stdin.fileno()) if path == "-" else Path(path)
    with open(source, "rb") as handle:
        number = 0
        while raw := handle.readline(MAX_LINE + 1):
            number += 1
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                yield number, Overlong(len(raw) + _skip_line(handle))
            else:
                yield number, raw


def _skip_line(handle: IO[bytes]) -> int:
    """Read past the rest of the current line; its number of bytes."""
    skipped = 0
    while chunk := handle.readline(_SKIP_CHUNK):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


_BLANK = object()


def _shown(path: str) -> str:
    """The file's name in messages."""
    return "<stdin>" if path == "-" else path


def _decoded(where: str, raw: bytes | Overlong) -> Any:
    """One line's JSON (``_BLANK`` for a blank line), decoded on its own so that a bad line of
    a stream spoils only itself."""
    if isinstance(raw, bytes) and not raw.strip():
        return _BLANK
    return json_value(raw, where)


def json_value(raw: bytes | Overlong, where: str) -> Any:
    """The JSON value of one line or broker message; EventFileError naming ``where`` for
    anything else, whatever the input: too long, not UTF-8, not JSON, nested too deeply
    for the decoder (a RecursionError), a number too long to convert."""
    size = raw.size if isinstance(raw, Overlong) else len(raw)
    if isinstance(raw, Overlong) or size > MAX_LINE:
        raise EventFileError(f"{where}: {size} bytes, longer than the limit of {MAX_LINE} "
                             "(an encrypted event must fit one overlay message)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EventFileError(f"{where}: not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise EventFileError(f"{where}: not JSON: {exc.msg}") from None
    except RecursionError:
        raise EventFileError(f"{where}: not JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise EventFileError(f"{where}: not JSON: {exc}") from None


@dataclass
class _EventLines:
    """Checks events line by line: the JSON, the schema, the advertisement, and that no id
    repeats one of the last ``REMEMBERED_IDS`` (subscribers remember that many and drop a
    repeat; further back, they deliver it again)."""

    path: str
    schema: Schema
    advertisement: EventFilter
    seen: dict[str, int] = field(default_factory=dict)

    def check(self, number: int, raw: bytes | Overlong) -> Event | None:
        """The event of line ``number`` (None if blank), or EventFileError naming the line."""
        where = f"{_shown(self.path)}:{number}"
        obj = _decoded(where, raw)
        if obj is _BLANK:
            return None
        event = parse_event(self.schema, obj, where)
        if event.event_id in self.seen:
            raise EventFileError(
                f"{where}: duplicate id {event.event_id!r}, first on line "
                f"{self.seen[event.event_id]} (subscribers deliver an id once)")
        if not self.advertisement.matches(event.values):
            raise EventFileError(
                f"{where}: event {event.event_id!r} lies outside the advertisement "
                f"{str(self.advertisement) or '(everything)'}")
        self.seen[event.event_id] = number
        if len(self.seen) > REMEMBERED_IDS:
            del self.seen[next(iter(self.seen))]  # the oldest: dicts keep insertion order
        return event


def read_events(path: str, schema: Schema, advertisement: EventFilter,
                each: Callable[[Event], None] | None = None,
                bad: Callable[[EventFileError], None] | None = None) -> list[Event]:
    """Every event of the file, refusing the whole file if any line is invalid, repeats an
    id, or lies outside the advertisement (nothing is published from a bad file).

    With ``each``, the file is a stream (stdin, a FIFO): each event is handed to ``each``
    as soon as its line arrives and nothing is collected; a bad line is handed to ``bad``
    and reading goes on, or without ``bad`` it ends the reading with EventFileError."""
    lines = _EventLines(path, schema, advertisement)
    events: list[Event] = []
    keep = each or events.append
    try:
        for number, raw in _raw_lines(path):
            try:
                event = lines.check(number, raw)
            except EventFileError as exc:
                if bad is None:
                    raise
                bad(exc)
                continue
            if event is not None:
                keep(event)
    except OSError as exc:
        raise EventFileError(f"cannot read {_shown(path)}: {exc.strerror}") from None
    return events


def read_deliveries(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a subscriber wrote so far (a trailing partial line is ignored)."""
    if not path.exists():
        return []
    out = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return out
