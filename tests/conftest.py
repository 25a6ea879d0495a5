"""Shared fixtures. Key server: see tests/keyserver_fixtures.py."""

from keyserver_fixtures import keyserver, keyserver_factory, postgres_url

__all__ = ["keyserver", "keyserver_factory", "postgres_url"]
