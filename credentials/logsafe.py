"""Escaping text from the network before it reaches a log.

A peer logs addresses claimed in HELLO frames, exception texts from parsing what peers
sent, and names read from their certificates. Written raw, a newline or a carriage return
in such a string starts a forged log line, and an ESC sequence rewrites the terminal. So
every character that is not printable (C0 and C1 controls, DEL, U+2028/U+2029, format
characters such as bidirectional overrides) is shown as a Python-style escape. Backslashes
are left alone: an attacker who writes a literal ``\\n`` gets those two characters on the
same line, which forges nothing, and the log's ordinary text (paths, reprs) stays as it
was. :class:`EscapingFormatter` applies the same rule to every formatted log line, so a
future log call that forgets :func:`escape` still cannot forge lines. With
``--log-format json``, :class:`JsonFormatter` writes one JSON object per line instead.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` with every non-printable character replaced by its escape; printable text
    (the usual case) is returned as is, so escaping twice changes nothing."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


class EscapingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose log line (time, level, logger, message) is
    escaped; the traceback and stack text appended after it are kept as they are, since
    they are multi-line by design and come from this process."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line (``time``, ``level``, ``logger``, ``message`` and, after an
    exception, ``exception``), for log shippers. JSON escapes every control character and,
    written as ASCII, every other character that could fool a terminal, so no string
    from a peer can end the line or forge another."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": self.formatTime(record), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=True)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """ISO 8601 in UTC with milliseconds, e.g. ``2026-01-31T12:00:00.123Z``."""
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


LOG_FORMATS = ("text", "json")


def log_formatter(kind: str) -> logging.Formatter:
    """The formatter of ``--log-format`` ``text`` (escaped lines) or ``json``."""
    if kind == "json":
        return JsonFormatter()
    return EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


#: Whether :func:`notice` writes JSON (``--log-format json``), set by the command line.
_notices_as_json = False


def use_log_format(kind: str) -> None:
    """Have :func:`notice` match the log's format."""
    global _notices_as_json
    _notices_as_json = kind == "json"


def notice(message: str) -> None:
    """A message for whoever watches stderr (ready, still waiting, done): a plain line, or
    under ``--log-format json`` a JSON object like the log's, so the stream stays one
    object per line."""
    if _notices_as_json:
        record = logging.LogRecord("ibe-pubsub", logging.INFO, "", 0, message, None, None)
        message = JsonFormatter().format(record)
    print(message, file=sys.stderr, flush=True)
