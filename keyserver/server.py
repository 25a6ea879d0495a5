"""Creating a key store (``keyserver init``) and serving it with uvicorn (``keyserver serve``)."""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn

from credentials.schema import Schema
from keyserver.app import create_app
from keyserver.keystore import create_keystore, load_keystore, passphrase_from_env
from keyserver.repository import audit
from keyserver.state import ServerConfig, build_state, open_database

log = logging.getLogger(__name__)


def initialise(data_dir: Path, schema: Schema, database_url: str | None,
               epoch_seconds: int, grace_seconds: int) -> str:
    """Create keys, database and epoch schedule; returns the admin token's file."""
    config = ServerConfig(data_dir=data_dir, database_url=database_url)
    passphrase = passphrase_from_env()
    store, _ = create_keystore(data_dir, schema, passphrase)
    engine, sessions, clock = open_database(config.url, epoch_seconds, grace_seconds)
    try:
        with sessions.begin() as session:
            audit(session, "admin", "init", clock.segments[0].first_epoch,
                  {"schema_id": schema.id, "server_key": store.public_document()["server_key"],
                   "epoch_length": epoch_seconds, "grace": grace_seconds})
    finally:
        engine.dispose()
    return str(data_dir / "admin.token")


def serve(config: ServerConfig, host: str, port: int, tls_cert: str | None,
          tls_key: str | None, log_level: str = "info") -> None:
    """Unseal (failing fast with a clear message), start the workers, then serve."""
    store = load_keystore(config.data_dir, passphrase_from_env())
    state = build_state(config, store)
    app = create_app(state)
    uvicorn.run(app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
                log_level=log_level, proxy_headers=False, server_header=False,
                timeout_graceful_shutdown=10)
