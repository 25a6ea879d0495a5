"""Shared fixtures. Key server: see tests/keyserver_fixtures.py; a threshold deployment:
tests/threshold_members.py."""

import pytest
from keyserver_fixtures import keyserver, keyserver_factory, postgres_url
from threshold_members import deployment

__all__ = ["deployment", "keyserver", "keyserver_factory", "postgres_url"]


@pytest.fixture(autouse=True)
def _known_servers_in_tmp(tmp_path_factory: pytest.TempPathFactory,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Peers the tests start (they inherit the environment) record key-server keys on first
    contact, and publishers the ids they sent, in files of the test's own, never in the
    user's home directory, and never meet a record of another test for a port reused
    since."""
    state = tmp_path_factory.mktemp("peer-state")
    monkeypatch.setenv("IBE_PUBSUB_KNOWN_SERVERS", str(state / "known_servers.json"))
    monkeypatch.setenv("IBE_PUBSUB_PUBLISHED_IDS", str(state / "published_ids.json"))
