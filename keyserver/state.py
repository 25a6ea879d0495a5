"""The key server's configuration and the shared state its request handlers use."""

from __future__ import annotations

import asyncio
import base64
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ibe_pubsub.credentials import schema_message
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver.binding import bind
from ibe_pubsub.keyserver.db import make_engine, make_sessions, sqlite_url
from ibe_pubsub.keyserver.epochs import Epoch, EpochClock
from ibe_pubsub.keyserver.exceptions import ServerSettingsError
from ibe_pubsub.keyserver.fair_pool import FairIssuer
from ibe_pubsub.keyserver.issuer import IssuerPool
from ibe_pubsub.keyserver.keystore import DATABASE_FILE, KeyStore
from ibe_pubsub.keyserver.locks import MIGRATIONS_LOCK, AdvisoryLock
from ibe_pubsub.keyserver.metrics import Metrics
from ibe_pubsub.keyserver.migrate import upgrade
from ibe_pubsub.keyserver.ratelimit import RateLimiter
from ibe_pubsub.keyserver.refusals import RefusalLog
from ibe_pubsub.keyserver.repository import EPOCH_SETTING, get_setting, load_clock
from ibe_pubsub.keyserver.schedule import SharedClock
from ibe_pubsub.keyserver.setup_protocol import SetupPlan
from ibe_pubsub.keyserver.threshold_store import ThresholdMember

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``keyserver serve`` can be told; defaults suit the demo and the benchmarks."""

    data_dir: Path
    database_url: str | None = None
    epoch_seconds: int | None = None
    grace_seconds: int | None = None
    workers: int | None = None
    identity_rate: float = 100.0
    identity_burst: int = 400
    key_rate: float = 500.0
    key_burst: int = 5000
    address_rate: float = 100.0
    address_burst: int = 1000
    bulk_max_body: int = 16 * MIB
    jobs_per_identity: int | None = None
    credentials_per_job: int = 4
    max_peer_addresses: int = 8
    allow_unsafe_permissions: bool = False

    @property
    def url(self) -> str:
        return self.database_url or sqlite_url(str(self.data_dir / DATABASE_FILE))


@dataclass
class AppState:
    config: ServerConfig
    store: KeyStore
    engine: Engine
    sessions: sessionmaker
    schedule: SharedClock
    pool: IssuerPool
    issuer: FairIssuer
    identity_limits: RateLimiter
    key_limits: RateLimiter
    address_limits: RateLimiter
    refusals: RefusalLog
    metrics: Metrics = field(default_factory=Metrics)
    member: ThresholdMember | None = None
    """Set when this server is a member of a threshold deployment: it then issues key
    shares (/v3) and no version-2 keys or certificates."""
    chunk_locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    @property
    def clock(self) -> EpochClock:
        """The epoch schedule the replicas share (:mod:`keyserver.schedule`); a threshold
        member's is aligned to Unix time (``EpochClock.aligned``), shared by every member."""
        current = self.schedule.current
        return current if self.member is None else current.aligned(time.time())

    def epoch(self, now: float | None = None) -> Epoch:
        return self.clock.current(time.time() if now is None else now)

    @functools.cached_property
    def schema_signature(self) -> str:
        """A member's partial signature of its schema (base64, tag 21), made once: the
        route that serves it is public."""
        assert self.member is not None
        group = self.store.group
        partial = T.partial_sign(group, self.member.secrets, schema_message(self.store.schema))
        return base64.b64encode(T.encode_partial_signature(partial)).decode()

    @functools.cached_property
    def members_signature(self) -> str:
        """A member's partial signature of the deployment's member keys (base64, tag 21),
        made once: clients take the keys ``t`` members signed, under ``X``."""
        assert self.member is not None
        message = T.members_message(self.member.public_key,
                                    self.member.member_keys)
        partial = T.partial_sign(self.store.group, self.member.secrets, message)
        return base64.b64encode(T.encode_partial_signature(partial)).decode()

    def close(self) -> None:
        self.schedule.close()
        self.pool.shutdown()
        self.refusals.close()
        self.engine.dispose()


def open_database(url: str, length: int | None, grace: int | None,
                  then: Callable[[Session, EpochClock], None] | None = None
                  ) -> tuple[Engine, sessionmaker, EpochClock]:
    """Migrate to the newest schema, then load (or start) the epoch schedule and run
    ``then`` in the same transaction (e.g. record the key store, :mod:`keyserver.binding`).
    All of it under the migrations lock, so replicas starting together take turns."""
    engine = make_engine(url)
    sessions = make_sessions(engine)
    try:
        with AdvisoryLock(engine, MIGRATIONS_LOCK), sessions.begin() as session:
            upgrade(url)
            clock = load_clock(session, time.time(), length, grace)
            if then is not None:
                then(session, clock)
    except BaseException:
        engine.dispose()
        raise
    return engine, sessions, clock


def check_member_epochs(own: tuple[int, int], plan: SetupPlan) -> None:
    """A member numbers its epochs as its set-up's plan says (threshold.json): one
    initialised with another length or grace (``own``) would number them apart from the
    others, and no client could combine its shares with theirs."""
    if own != (plan.epoch_seconds, plan.grace):
        raise ServerSettingsError(
            f"this member was initialised with {own[0]} s epochs and a {own[1]} s grace "
            f"window, but the deployment's plan has {plan.epoch_seconds} s and {plan.grace} "
            "s: every member must number epochs alike (run threshold-setup with "
            "--epoch-seconds and --grace-seconds equal to every member's keyserver init "
            "values; a member initialised otherwise needs a new data directory)")


def initialised_epochs(config: ServerConfig) -> tuple[int, int] | None:
    """The epoch length and grace ``keyserver init`` stored in this server's database, or
    None where there is none to read (no database yet, or not migrated)."""
    if config.database_url is None and not (config.data_dir / DATABASE_FILE).exists():
        return None
    engine = make_engine(config.url)
    try:
        with make_sessions(engine)() as session:
            stored = get_setting(session, EPOCH_SETTING)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    if stored is None:
        return None
    return EpochClock.from_json(stored).initial


def build_state(config: ServerConfig, store: KeyStore, member: ThresholdMember | None = None
                ) -> AppState:
    if member is not None and (config.epoch_seconds, config.grace_seconds) != (None, None):
        raise ServerSettingsError(
            "a member of a threshold deployment keeps the epoch length and grace it was "
            "initialised with (keyserver init --epoch-seconds), the same at every member: "
            "its epochs are numbered by that length from Unix time, and another length "
            "would renumber them")

    def bind_and_check(session: Session, clock: EpochClock) -> None:
        bind(session, store.fingerprint)
        if member is not None:
            check_member_epochs(clock.initial, member.plan)

    engine, sessions, clock = open_database(config.url, config.epoch_seconds,
                                            config.grace_seconds, bind_and_check)
    pool = IssuerPool(store, config.workers, member)
    pool.warm_up()
    # By default one identity may fill all workers but one, so another finds one free.
    per_identity = config.jobs_per_identity or max(1, pool.workers - 1)
    return AppState(config=config, store=store, engine=engine, sessions=sessions,
                    schedule=SharedClock(sessions, clock),
                    pool=pool, issuer=FairIssuer(pool, per_identity, config.credentials_per_job),
                    identity_limits=RateLimiter(config.identity_rate, config.identity_burst),
                    key_limits=RateLimiter(config.key_rate, config.key_burst),
                    address_limits=RateLimiter(config.address_rate, config.address_burst),
                    refusals=RefusalLog(sessions), member=member)
