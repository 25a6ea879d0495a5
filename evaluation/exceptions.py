"""The error base of the benchmarks and experiments: every error this package raises is an
:class:`EvaluationError`, so a caller can catch them all in one clause. A wrong argument type
is still a plain ``TypeError``, as anywhere in Python."""


class EvaluationError(Exception):
    """Base class of this package's errors."""


class BenchSettingsError(EvaluationError, ValueError):
    """A benchmark or experiment size or setting out of its range."""


class BenchRunError(EvaluationError, RuntimeError):
    """A process a benchmark started failed, or two runs that must agree did not."""


class NetworkLabError(EvaluationError, OSError):
    """The network namespaces or the link emulator of a benchmark could not be set up."""
