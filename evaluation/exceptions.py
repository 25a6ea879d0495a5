"""The error base of the benchmarks and experiments: every error this package raises is an
:class:`EvaluationError`, so a caller can catch them all in one clause."""


class EvaluationError(Exception):
    """Base class of this package's errors."""
