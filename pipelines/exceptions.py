"""The error base of bulk enrolment: every error this package raises is a
:class:`PipelinesError`, so a caller can catch them all in one clause."""


class PipelinesError(Exception):
    """Base class of this package's errors."""
