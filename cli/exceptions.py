"""The error base of the command line (usage and configuration): every error this package raises
is a :class:`CliError`, so a caller can catch them all in one clause. A wrong argument type
is still a plain ``TypeError``, as anywhere in Python."""


class CliError(Exception):
    """Base class of this package's errors."""
