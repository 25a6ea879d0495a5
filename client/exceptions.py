"""The error base of the application API: every failure of a client call is a
:class:`ClientError`, so an application catches them all in one clause. Errors of the
layers below (a refused enrolment, an unknown attribute, a key server that changed its key)
arrive wrapped, with the same one-line message ``ibe-pubsub`` prints, the original as
``__cause__``. A wrong argument type is still a plain ``TypeError``, as anywhere in Python."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ibe_pubsub.credentials import CredentialsError
from ibe_pubsub.keyserver import KeyServerError
from ibe_pubsub.overlay import OverlayError
from ibe_pubsub.peer import PeerError
from ibe_pubsub.peer import PublishRefused as PeerPublishRefused


class ClientError(Exception):
    """Base class of this package's errors."""


class ConfigError(ClientError):
    """An option from the configuration file or the environment cannot be used."""


class ConnectError(ClientError):
    """The subscriber or publisher could not start: the key server refused or could not be
    reached, the predicate or bundle is wrong, no root registered, ..."""


class ConnectTimeout(ConnectError, TimeoutError):
    """A subscriber did not join its trees in time."""


class PublishRefused(ClientError, PeerPublishRefused):
    """The event was not sent: its values do not fit the schema, it lies outside the
    advertisement, or the publisher's keys do not cover it (also a ``peer.PublishRefused``)."""


class SendFailed(ClientError):
    """Some published events could not be handed to a root (reported when closing)."""


class ReceiveTimeout(ClientError, TimeoutError):
    """No event arrived within the time given."""


class SubscriberClosed(ClientError):
    """The subscriber was closed, and every event it received was taken."""


class SubscriberFailed(ClientError):
    """The subscriber stopped on its own (its bundle's keys expired); the message says why."""


_BELOW = (CredentialsError, KeyServerError, OverlayError, PeerError)


@contextmanager
def wrapped(kind: type[ClientError]) -> Iterator[None]:
    """Re-raise an error of the layers below as ``kind``, with its message."""
    try:
        yield
    except ClientError:
        raise
    except _BELOW as exc:
        raise kind(str(exc)) from exc
