"""The error base of the credentials and the scheme (parsing, decoding, keys, ciphertexts):
every error this package raises is a :class:`CredentialsError`, so a caller can catch them
all in one clause."""


class CredentialsError(Exception):
    """Base class of this package's errors."""
