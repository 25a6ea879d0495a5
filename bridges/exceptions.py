"""The bridges' errors, under one base so the CLI turns any of them into one line."""

from __future__ import annotations


class BridgeError(Exception):
    """Base class of this package's errors."""


class ClientLibraryMissing(BridgeError):
    """The broker's client library is not installed (it comes with the ``bridges`` extra)."""


def library_missing(library: str) -> ClientLibraryMissing:
    """The one line a user sees for a missing client library: what to install."""
    return ClientLibraryMissing(f"{library} is missing: install ibe-pubsub[bridges]")


class MessageRefused(BridgeError, ValueError):
    """A broker message is not an event of the schema (the message says why)."""


class BrokerLost(BridgeError, ConnectionError):
    """The connection to the broker ended; the bridge connects again."""
