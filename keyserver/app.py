"""The FastAPI application of the key server (see keyserver/README.md for the API)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ibe_pubsub.keyserver import (
    routes_admin,
    routes_bulk,
    routes_directory,
    routes_enrol,
    routes_public,
    routes_threshold,
)
from ibe_pubsub.keyserver.errors import install_error_handlers
from ibe_pubsub.keyserver.middleware import Gate, RequestMetrics, route_rules
from ibe_pubsub.keyserver.state import AppState


def create_app(state: AppState) -> FastAPI:
    """The app over an already opened key store, database and issuer pool (closed on exit)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="ibe-pubsub key server", version="1", lifespan=lifespan,
                  description="Issues credential keys for broker-less content-based "
                  "publish/subscribe with identity-based encryption.")
    app.state.keyserver = state
    for module in (routes_public, routes_admin, routes_enrol, routes_bulk, routes_directory,
                   routes_threshold):
        app.include_router(module.router)
    # Outermost last: metrics see every answer; the error handlers' catch-all also covers
    # the gate (a database failure while checking a token is a JSON 500).
    app.add_middleware(Gate, state=state, rules=route_rules(state.config.bulk_max_body))
    install_error_handlers(app)
    app.add_middleware(RequestMetrics, metrics=state.metrics)
    return app
