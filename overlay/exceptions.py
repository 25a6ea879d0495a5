"""The error base of the overlay protocol (wire messages, cryptographic checks): every error
this package raises is an :class:`OverlayError`, so a caller can catch them all in one
clause. A wrong argument type is still a plain ``TypeError``, as anywhere in Python."""


class OverlayError(Exception):
    """Base class of this package's errors."""
