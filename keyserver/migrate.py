"""Running the Alembic migrations of ``migrations/`` from code (init, serve, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

# Installed side by side with this package (source checkout, editable install or wheel).
MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


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
