"""Credentials: the event-space schema, credential decompositions and the pairing-based scheme.

A pure library, the lowest layer: it imports nothing else of this project, uses no network
and writes no file (it reads a schema file when asked to load one).
"""
