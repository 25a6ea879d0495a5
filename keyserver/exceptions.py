"""The error base of the key server and its client: every error this package raises is a
:class:`KeyServerError`, so a caller can catch them all in one clause. A wrong argument type
is still a plain ``TypeError``, as anywhere in Python."""


class KeyServerError(Exception):
    """Base class of this package's errors."""


class ServerSettingsError(KeyServerError, ValueError):
    """A setting of the key server (address, database URL, epochs, limits, passphrase) that
    it cannot run with."""
