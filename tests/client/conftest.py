"""One real overlay per test module: a key server (SQLite) and one root peer process holding
the three trees of the stock-quote schema, over mutual TLS on 127.0.0.1; the clients under
test trust the key server through the same known-servers file as the root."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from keyserver_fixtures import rooted_cluster

from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess


@dataclass(frozen=True)
class Overlay:
    server: str
    cluster: Cluster
    root: PeerProcess

    @property
    def known_servers(self) -> Path:
        return self.cluster.workdir / "known_servers.json"

    def root_children(self) -> set[str]:
        """The addresses of the root's children, in any tree."""
        trees = self.root.get("/status").json()["trees"]
        return {child["address"] for tree in trees.values() for vp in tree["virtual_peers"]
                for child in vp["children"]}

    def members(self, attribute: str) -> set[str]:
        """The addresses the directory lists in a tree, besides its root."""
        found = self.cluster.admin.lookup(attribute, sample=32)["members"]
        return {entry["address"] for entry in found}


#: Epochs short enough for a test to see a rollover (seconds; the grace window after each).
SHORT_EPOCH, SHORT_GRACE = 10, 4


@contextmanager
def _running(work: Path, init_args: tuple[str, ...] = ()) -> Iterator[Overlay]:
    with rooted_cluster(work, init_args, peer_args=("--http", "0")) as (server, cluster, root):
        yield Overlay(server.base_url, cluster, root)


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlay]:
    with _running(tmp_path_factory.mktemp("client-overlay")) as running:
        yield running


@pytest.fixture(scope="module")
def short_epochs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlay]:
    """The same, with epochs of SHORT_EPOCH seconds."""
    with _running(tmp_path_factory.mktemp("client-epochs"),
                  ("--epoch-seconds", str(SHORT_EPOCH), "--grace-seconds", str(SHORT_GRACE))
                  ) as running:
        yield running
