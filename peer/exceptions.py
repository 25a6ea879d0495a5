"""The error base of a running peer and the publisher: every error this package raises is a
:class:`PeerError`, so a caller can catch them all in one clause. A wrong argument type is
still a plain ``TypeError``, as anywhere in Python."""


class PeerError(Exception):
    """Base class of this package's errors."""
