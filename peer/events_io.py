"""Events as JSON lines: the publisher's input file and the subscriber's delivery output.

A line is ``{"id": str, "values": {attribute: value}, "body": str}``; the body is
UTF-8 text (a delivered body that is not UTF-8 is written as ``body_base64``).
Delivered lines also carry ``delivered_at`` (Unix seconds) so delays can be
measured. Every written line is flushed at once, so a reader tailing the file
sees each delivery as it happens.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ibe_pubsub.credentials import Event, EventFilter, Schema, SchemaError
from ibe_pubsub.peer.exceptions import PeerError

MAX_ID = 200


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

    def write(self, event: Event, delivered_at: float | None = None) -> None:
        stamp = time.time() if delivered_at is None else delivered_at
        self._out.write(json.dumps(event_line(event, stamp), sort_keys=True) + "\n")
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
    return Event(event_id, checked, body.encode("utf-8"))


def iter_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON) for every non-blank line; '-' reads stdin."""
    with contextlib.ExitStack() as stack:
        handle = sys.stdin if path == "-" else stack.enter_context(
            Path(path).open(encoding="utf-8"))
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                yield number, json.loads(text)
            except json.JSONDecodeError as exc:
                raise EventFileError(f"{path}:{number}: not JSON: {exc.msg}") from None


def read_events(path: str, schema: Schema, advertisement: EventFilter) -> list[Event]:
    """Every event of the file, refusing the whole file if any line is invalid, repeats an
    id, or lies outside the advertisement (nothing is published from a bad file)."""
    events: list[Event] = []
    seen: dict[str, int] = {}
    try:
        for number, obj in iter_lines(path):
            where = f"{path}:{number}"
            event = parse_event(schema, obj, where)
            if event.event_id in seen:
                raise EventFileError(
                    f"{where}: duplicate id {event.event_id!r}, first on line "
                    f"{seen[event.event_id]} (subscribers deliver an id once)")
            if not advertisement.matches(event.values):
                raise EventFileError(
                    f"{where}: event {event.event_id!r} lies outside the advertisement "
                    f"{str(advertisement) or '(everything)'}")
            seen[event.event_id] = number
            events.append(event)
    except OSError as exc:
        raise EventFileError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise EventFileError(f"{path} is not UTF-8 text") from None
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
