"""The JSON mapping between broker messages and events (docs/bridges.md), kept in one place
so both brokers and both directions speak the same format as the CLI's events files.

In: a message's payload is one JSON object of the files ``ibe-pubsub publish --events``
reads, ``{"id"?, "values", "body"?}``, checked by the same code. Unlike a file line, it may
leave out ``id``: the publisher then makes one up (and a redelivered message becomes a
second event, so feeds that can repeat a message should give ids).
Out: an event becomes the JSON object ``ibe-pubsub peer run --events-out`` writes, on a topic
made from a template of the event's values.
"""

from __future__ import annotations

import dataclasses
import json
import string

from ibe_pubsub.bridges.exceptions import BridgeError, MessageRefused
from ibe_pubsub.client import Delivery
from ibe_pubsub.credentials import Event, Schema
from ibe_pubsub.peer import EventFileError, event_line, json_value, parse_event

#: A stand-in for the id a message left out; the event then carries the empty id.
_NO_ID = "-"


def message_event(payload: bytes, schema: Schema, where: str) -> Event:
    """The event a broker message carries, checked against the schema; its ``event_id`` is
    ``""`` if the message gave none. MessageRefused, naming ``where``, if it is not one,
    whatever the payload (decoded and size-checked as a line of an events file)."""
    try:
        obj = json_value(payload, where)
        given = not isinstance(obj, dict) or "id" in obj
        event = parse_event(schema, obj if given else {**obj, "id": _NO_ID}, where)
    except EventFileError as exc:
        raise MessageRefused(str(exc)) from None
    return event if given else dataclasses.replace(event, event_id="")


def delivery_payload(delivery: Delivery) -> bytes:
    """A delivered event as the JSON line ``peer run --events-out`` writes (``id``,
    ``values``, ``body`` or ``body_base64``, ``delivered_at``), without the newline."""
    event = Event(delivery.id, dict(delivery.values), delivery.body)
    return json.dumps(event_line(event, delivery.received_at), sort_keys=True).encode()


class TopicTemplate:
    """Where an event goes: a topic or subject with ``{id}`` and ``{ATTRIBUTE}`` fields. A
    value's characters that the broker reads as level separators or wildcards
    (``reserved``) become ``_``, so no event can choose a topic outside the template."""

    def __init__(self, template: str, reserved: str) -> None:
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise BridgeError(f"topic template {template!r}: {exc}") from None
        self.fields = {name for _, name, _, _ in parts if name is not None}
        if any(not name.isidentifier() or spec or conversion
               for _, name, spec, conversion in parts if name is not None):
            raise BridgeError(f"topic template {template!r}: fields are {{id}} or "
                              "{ATTRIBUTE}, without format specs")
        self.template = template
        self.reserved = reserved

    def check(self, schema: Schema) -> None:
        """Refuse fields that name no attribute, before any event is taken."""
        unknown = self.fields - {"id", *schema.names}
        if unknown:
            raise BridgeError(f"topic template {self.template!r}: no attribute "
                              f"{', '.join(sorted(unknown))} in the schema")

    def topic(self, delivery: Delivery) -> str:
        fields = {"id": delivery.id, **delivery.values}
        return self.template.format_map({name: self._clean(fields[name])
                                         for name in self.fields})

    def _clean(self, value: object) -> str:
        text = "".join("_" if c in self.reserved or not c.isprintable() else c
                       for c in str(value))
        return text or "_"
