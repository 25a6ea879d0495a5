"""Running the Alembic migrations of ``ibe_pubsub.migrations`` from code (init, serve, tests)."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config

# Found as the package's resources, wherever and however the package is installed.
MIGRATIONS = files("ibe_pubsub.migrations")


def alembic_config(url: str) -> Config:
    """An Alembic configuration for ``url`` without an ini file (the URL never goes through
    configparser interpolation, so passwords with ``%`` work)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
