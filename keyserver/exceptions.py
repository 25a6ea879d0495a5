"""The error base of the key server and its client: every error this package raises is a
:class:`KeyServerError`, so a caller can catch them all in one clause."""


class KeyServerError(Exception):
    """Base class of this package's errors."""
