"""``python dropping_peer.py ARGS`` runs ``ibe-pubsub ARGS`` as a peer that forwards no
event: it joins, answers heartbeats and takes events like any peer, but its routing
picks no child. The dropper of the overlay-robustness tests."""

import sys
from typing import Any

from ibe_pubsub.cli.app import main
from ibe_pubsub.overlay.dissemination import Dissemination


def _forward_to_nobody(self: Dissemination, vp: Any, digest: bytes, event: Any,
                       now: float) -> list[Any]:
    return []


Dissemination._route = _forward_to_nobody
sys.exit(main())
