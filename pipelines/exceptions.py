"""The error base of bulk enrolment: every error this package raises is a
:class:`PipelinesError`, so a caller can catch them all in one clause. A wrong argument type
is still a plain ``TypeError``, as anywhere in Python."""


class PipelinesError(Exception):
    """Base class of this package's errors."""
