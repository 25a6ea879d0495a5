"""The round trip in ``credentials/scheme.py``'s module docstring runs, and really checks."""

from __future__ import annotations

import doctest

from ibe_pubsub.credentials import scheme


def test_the_scheme_modules_round_trip_example_runs():
    result = doctest.testmod(scheme, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 12
    assert result.failed == 0


def test_the_doctest_fails_when_a_subscriber_decrypts_what_it_should_not(monkeypatch):
    """Control: were a non-matching subscriber's decryption to succeed, the example fails."""
    real = scheme.decrypt

    def decrypt_anything(pp, key, ciphertext):
        try:
            return real(pp, key, ciphertext)
        except scheme.DecryptionError:
            return "decrypted"

    monkeypatch.setattr(scheme, "decrypt", decrypt_anything)
    result = doctest.testmod(scheme, optionflags=doctest.ELLIPSIS)
    assert result.failed == 1
