"""The error base of the credentials and the scheme (parsing, decoding, keys, ciphertexts):
every error this package raises is a :class:`CredentialsError`, so a caller can catch them
all in one clause. A wrong argument type is still a plain ``TypeError``, as anywhere in
Python."""


class CredentialsError(Exception):
    """Base class of this package's errors."""


class DecompositionError(CredentialsError, ValueError):
    """A value, range or credential that does not fit its attribute's domain."""
