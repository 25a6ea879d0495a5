"""Credentials: the event-space schema, credential decompositions and the pairing-based scheme.

A pure library: no network or disk I/O happens here.
"""
