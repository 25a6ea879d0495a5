"""uvicorn's server announcing when it listens. ``keyserver.server`` imports it (and the
rest of the web stack) only once the start-up checks have passed."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, calling ``on_ready(url)`` once its socket listens (so a client
    connecting from then on is served), e.g. to write ``--ready-file``."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.config.host, self.servers[0].sockets[0].getsockname()[1]
            scheme = "https" if self.config.is_ssl else "http"
            self._on_ready(f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}")
