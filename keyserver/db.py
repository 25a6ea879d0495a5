"""The key server's database: SQLAlchemy 2 models and the engine/session factory.

The schema itself is created and evolved only by the Alembic migrations in
``migrations/``; these models describe it for queries (a test checks that the
two agree). SQLite (a file in the data directory) by default, PostgreSQL by URL.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    false,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from ibe_pubsub.keyserver.exceptions import ServerSettingsError


class Base(DeclarativeBase):
    pass


class Setting(Base):
    """Small key/value facts of the deployment, e.g. the epoch schedule."""

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON, nullable=False)


class Identity(Base):
    """A publisher, subscriber or root; only the SHA-256 of its bearer token is kept.
    ``bulk_only``: created by bulk issuance, it has no policy and gets keys only that way
    (the enrolment endpoints refuse it)."""

    __tablename__ = "identities"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    policy: Mapped[str | None] = mapped_column(Text, nullable=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    bulk_only: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                            server_default=false())


class AuditEntry(Base):
    """Append-only record of admin actions and issuances (triggers refuse UPDATE/DELETE)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, nullable=False)
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    detail: Mapped[Any] = mapped_column(JSON, nullable=False)


class DirectoryEntry(Base):
    """A peer's lease in the bootstrap directory of one attribute tree; ``vouched_at`` is when
    another identity last reported it answering (``routes_directory``)."""

    __tablename__ = "directory"
    __table_args__ = (
        UniqueConstraint("attribute", "address", name="uq_directory_attribute_address"),
        Index("ix_directory_attribute_expires", "attribute", "expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attribute: Mapped[str] = mapped_column(String(200), nullable=False)
    address: Mapped[str] = mapped_column(String(300), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    identity_id: Mapped[int] = mapped_column(
        ForeignKey("identities.id", ondelete="CASCADE"), nullable=False)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False)
    vouched_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class TreeGrant(Base):
    """A subscriber's right to look up one tree: the key server issued it credentials that
    join it (``enrolment.joined_trees``), valid until ``expires_at``. Granted by issuance,
    never by the subscriber's own directory registrations, which anyone could make first
    (``routes_directory``)."""

    __tablename__ = "tree_grants"

    identity_id: Mapped[int] = mapped_column(
        ForeignKey("identities.id", ondelete="CASCADE"), primary_key=True)
    attribute: Mapped[str] = mapped_column(String(200), primary_key=True)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False)


class PeerAddress(Base):
    """Who owns a listening address: the identity whose peer-link certificate names it, until
    that certificate expires. Only the owner may list the address in the directory."""

    __tablename__ = "peer_addresses"
    __table_args__ = (Index("ix_peer_addresses_identity", "identity_id"),)

    address: Mapped[str] = mapped_column(String(300), primary_key=True)
    identity_id: Mapped[int] = mapped_column(
        ForeignKey("identities.id", ondelete="CASCADE"), nullable=False)
    certified_at: Mapped[float] = mapped_column(Float, nullable=False)
    expires_at: Mapped[float] = mapped_column(Float, nullable=False)


class BulkChunk(Base):
    """The sealed result of one bulk-issuance chunk, so a repeated chunk id issues nothing."""

    __tablename__ = "bulk_chunks"

    chunk_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    sealed_result: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


SUPPORTED_URLS = "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
SUPPORTED_DRIVERS = ("sqlite", "sqlite+pysqlite", "postgresql+psycopg")


def sqlite_url(path: str) -> str:
    return f"sqlite:///{path}"


def check_url(url: str) -> None:
    """Refuse (ValueError) a URL of a database or driver this build does not ship, before
    SQLAlchemy fails on it with a traceback or a plugin error."""
    try:
        driver = make_url(url).drivername
    except ArgumentError:
        driver = None
    if driver not in SUPPORTED_DRIVERS:
        scheme = url.split("://", 1)[0] + "://..." if "://" in url else "without a scheme"
        raise ServerSettingsError(f"unsupported database URL {scheme}: the key server supports "
                                  f"{SUPPORTED_URLS}")


def make_engine(url: str) -> Engine:
    """An engine tuned for a small multi-threaded server: WAL and a busy timeout on SQLite."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_sessions(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
