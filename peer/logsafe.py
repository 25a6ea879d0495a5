"""Escaping text from the network before it reaches a log.

A peer logs addresses claimed in HELLO frames, exception texts from parsing what peers
sent, and names read from their certificates. Written raw, a newline or a carriage return
in such a string starts a forged log line, and an ESC sequence rewrites the terminal. So
every character that is not printable (C0 and C1 controls, DEL, U+2028/U+2029, format
characters such as bidirectional overrides) is shown as a Python-style escape. Backslashes
are left alone: an attacker who writes a literal ``\\n`` gets those two characters on the
same line, which forges nothing, and the log's ordinary text (paths, reprs) stays as it
was. :class:`EscapingFormatter` applies the same rule to every formatted log line, so a
future log call that forgets :func:`escape` still cannot forge lines.
"""

from __future__ import annotations

import logging

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
