"""Two key-server replicas on one PostgreSQL database, driven concurrently through both:
identities, enrolments and bulk issuance stay consistent, a revocation on one is refused on
the other at once, both roll the epoch over identically, a bulk run resumed on the other
replica issues nothing twice, and a replica killed mid-burst loses nothing it answered."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from keyserver_fixtures import PASSPHRASE
from sqlalchemy import text

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.postgres import fresh_database
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError
from ibe_pubsub.keyserver.db import make_engine, make_sessions
from ibe_pubsub.keyserver.keystore import ADMIN_TOKEN_FILE, PUBLIC_FILE, SEALED_FILE
from ibe_pubsub.keyserver.locks import AdvisoryLock, holding
from ibe_pubsub.keyserver.migrate import downgrade, upgrade
from ibe_pubsub.keyserver.repository import load_clock
from ibe_pubsub.keyserver.schedule import SharedClock
from ibe_pubsub.pipelines.chunks import chunked, read_items
from ibe_pubsub.pipelines.issue import IssueOptions, issue_bulk
from ibe_pubsub.pipelines.local_job import run_local
from ibe_pubsub.pipelines.requests import Settings

EPOCH_SECONDS = 4
SERVE = ("--workers", "1", "--rate", "1000", "--burst", "1000")
_names = itertools.count()


@dataclass
class Replica:
    url: str
    process: subprocess.Popen[bytes]
    data_dir: Path

    def admin(self) -> KeyServerClient:
        token = (self.data_dir / ADMIN_TOKEN_FILE).read_text().strip()
        return KeyServerClient(self.url, token, retries=0)


@pytest.fixture(scope="module")
def replicas(postgres_url: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Replica, Replica]]:
    """A key store on a fresh database left one migration behind, and two replicas started
    at once (so both migrate it together): A on the whole data directory, B on a copy of
    the sealed key, public parameters and admin token alone."""
    url = fresh_database(postgres_url)
    root = tmp_path_factory.mktemp("replicas")
    init_keyserver(root / "a", PASSPHRASE, ("--database-url", url, "--epoch-seconds",
                                             str(EPOCH_SECONDS), "--grace-seconds", "1"))
    downgrade(url, "0002")
    (root / "b").mkdir(mode=0o700)
    for name in (SEALED_FILE, PUBLIC_FILE, ADMIN_TOKEN_FILE):
        shutil.copy2(root / "a" / name, root / "b" / name)
    started = []
    for name in ("a", "b"):
        port = free_port()
        process = start_keyserver(root / name, port, PASSPHRASE, ("--database-url", url, *SERVE),
                                  log=root / f"{name}.log")
        started.append(Replica(f"http://127.0.0.1:{port}", process, root / name))
    try:
        for replica in started:
            wait_ready(replica.url, replica.process)
        yield started[0], started[1]
    finally:
        for replica in started:
            stop(replica.process)


def _concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls at once; each one's result, or the KeyServerRequestError it raised."""
    def attempt(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except KeyServerRequestError as error:
            return error

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(attempt, calls))


def _audit(client: KeyServerClient) -> list[dict[str, Any]]:
    entries, after = [], 0
    while page := client.audit(after=after, limit=1000):
        entries += page
        after = page[-1]["id"]
    return entries


def _enrol(replica: Replica, token: str) -> Callable[[], dict[str, Any]]:
    def call() -> dict[str, Any]:
        with KeyServerClient(replica.url, token, retries=0) as client:
            return client.enrol_subscriber("price < 10", fine_depth=0, max_credentials=1)
    return call


def test_identities_and_enrolments_through_both_are_consistent(replicas):
    a, b = replicas
    admins = (a.admin(), b.admin())
    names = [f"both-{i}" for i in range(6)]
    created = _concurrently([lambda n=n, c=c: c.create_identity(n, "subscriber")
                             for n in names for c in admins])
    by_name = Counter(r["name"] for r in created if isinstance(r, dict))
    assert by_name == Counter(names)  # one identity per name, whichever replica won
    assert all(r.status == 409 for r in created if isinstance(r, KeyServerRequestError))
    assert admins[0].list_identities() == admins[1].list_identities()

    tokens = [r["token"] for r in created if isinstance(r, dict)]
    bundles = _concurrently([_enrol(replica, t) for t in tokens for replica in (a, b)])
    assert all(isinstance(x, dict) for x in bundles), bundles
    audited = Counter(e["detail"]["identity"] for e in _audit(admins[1])
                      if e["action"] == "issue_subscriber")
    assert audited == Counter({n: 2 for n in names})  # every enrolment audited once
    assert _audit(admins[0]) == _audit(admins[1])


def test_a_revocation_on_one_replica_is_refused_on_the_other_within_a_second(replicas):
    a, b = replicas
    admin = a.admin()
    created = admin.create_identity("revoked-on-a", "subscriber")
    enrol_on_b = _enrol(b, created["token"])
    enrol_on_b()  # the control: B serves it before the revocation
    admin.revoke(created["id"])
    revoked = time.monotonic()
    with pytest.raises(KeyServerRequestError) as refused:
        enrol_on_b()
    assert refused.value.status == 403 and refused.value.code == "revoked"
    assert time.monotonic() - revoked < 1.0


def test_the_epoch_rolls_over_identically_on_both(replicas):
    a, b = replicas
    public = (KeyServerClient(a.url), KeyServerClient(b.url))
    ends = public[0].epoch()["epoch_end"]
    if ends - time.time() < 0.5:  # read both well inside one epoch
        time.sleep(ends - time.time() + 0.1)
    before = [c.epoch() for c in public]
    assert before[0]["epoch"] == before[1]["epoch"]
    keys = ("epoch", "epoch_start", "epoch_end", "epoch_length", "grace")
    assert [before[0][k] for k in keys] == [before[1][k] for k in keys]
    time.sleep(max(0.0, before[0]["epoch_end"] - time.time()) + 0.2)
    after = [c.epoch() for c in public]
    assert after[0]["epoch"] == after[1]["epoch"] == before[0]["epoch"] + 1
    assert [after[0][k] for k in keys] == [after[1][k] for k in keys]
    assert after[0]["epoch_start"] == pytest.approx(before[0]["epoch_end"])


def _decomposed(root: Path, count: int) -> tuple[Path, list[str]]:
    prefix = f"bulk-{next(_names)}-"
    names = [f"{prefix}{i}" for i in range(count)]
    table = pa.table({"identity": names, "role": ["subscriber"] * count,
                      "predicate": [f"price <= {10 + i}" for i in range(count)]})
    root.mkdir(parents=True)
    pq.write_table(table, root / "requests.parquet")
    assert run_local(Settings(default_schema()), root / "requests.parquet",
                     root / "decomposed").accepted == count
    return root / "decomposed", names


def _keys_issued(replicas: tuple[Replica, Replica]) -> float:
    """Subscriber credential keys the two replicas have made, from their metrics."""
    prefix = 'ibe_keyserver_keys_issued_total{kind="subscriber_credential"}'
    total = 0.0
    for replica in replicas:
        for line in KeyServerClient(replica.url).metrics().splitlines():
            if line.startswith(prefix):
                total += float(line.split()[-1])
    return total


def test_bulk_issue_resumed_on_the_other_replica_issues_nothing_twice(replicas, tmp_path):
    a, b = replicas
    source, names = _decomposed(tmp_path / "run", 6)
    keys, options = tmp_path / "keys", IssueOptions(max_identities=2)
    with a.admin() as client:
        assert issue_bulk(client, source, keys, options).written == 6
    bundles = {p.name: p.read_bytes() for p in keys.glob("*.json")}
    # killed after A answered every chunk but before logging any: B answers from the store
    (keys / ".bulk-issue" / "chunks.jsonl").write_text("")
    for path in keys.glob("*.json"):
        path.unlink()
    with b.admin() as client:
        report = issue_bulk(client, source, keys, options)
    assert (report.chunks_sent, report.written) == (3, 6)
    assert {p.name: p.read_bytes() for p in keys.glob("*.json")} == bundles
    issued = Counter(e["detail"]["identity"] for e in _audit(b.admin())
                     if e["action"] == "issue_bulk")
    assert {n: issued[n] for n in names} == {n: 1 for n in names}

    # one new chunk sent to both at once: one of them issues it, the other waits and answers
    # the stored result (the advisory lock), so its keys are made once
    source, names = _decomposed(tmp_path / "race", 2)
    chunk = next(chunked(read_items(source), 2, 4000))
    chunk_id = f"race-{uuid.uuid4().hex}"
    made = _keys_issued(replicas)
    answers = _concurrently([lambda r=r: r.admin().bulk(chunk_id, list(chunk.items))
                             for r in (a, b)])
    assert answers[0] == answers[1] and len(answers[0]["bundles"]) == 2
    credentials = sum(len(v) for bundle in answers[0]["bundles"]
                      for v in bundle["credentials"].values())
    assert _keys_issued(replicas) - made == credentials


def test_the_advisory_lock_lets_one_process_in_at_a_time(postgres_url):
    engine = make_engine(postgres_url)
    order: list[str] = []
    try:
        with AdvisoryLock(engine, "test-lock"):
            waiter = threading.Thread(target=lambda: (
                AdvisoryLock(engine, "test-lock").__enter__(), order.append("second")))
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive()  # blocked while the first holds it
            order.append("first")
        waiter.join(10)
        assert order == ["first", "second"]
    finally:
        engine.dispose()


def _advisory_locks(engine: Any) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())")).scalar())


async def _cancel_a_waiter(engine: Any, enter: Callable[[AdvisoryLock], Any]) -> int:
    """Advisory locks held a second after a task waiting for a held lock (through
    ``enter``) was cancelled and the lock then freed; the cancelled task is kept, as a
    server keeps a request's for a while, and the garbage collector is off."""
    holder = AdvisoryLock(engine, "bulk-chunk:c1")
    holder.acquire()

    async def waiter() -> None:
        async with enter(AdvisoryLock(engine, "bulk-chunk:c1")):
            await asyncio.sleep(0)

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    holder.release()  # the waiting thread gets the lock now
    await asyncio.sleep(1.0)
    return await asyncio.to_thread(_advisory_locks, engine)


@contextlib.asynccontextmanager
async def _acquire_then_try(lock: AdvisoryLock) -> AsyncIterator[None]:
    """The flawed pattern: acquire in a thread, and only then try/finally release."""
    await asyncio.to_thread(lock.acquire)
    try:
        yield
    finally:
        await asyncio.to_thread(lock.release)


def test_a_request_cancelled_while_waiting_for_a_chunk_lock_leaves_it_free(postgres_url):
    engine = make_engine(fresh_database(postgres_url))
    gc.disable()
    try:
        assert asyncio.run(_cancel_a_waiter(engine, holding)) == 0
        # Control: acquiring in a thread before the try leaves the lock held.
        assert asyncio.run(_cancel_a_waiter(engine, _acquire_then_try)) == 1
    finally:
        gc.enable()
        gc.collect()
        engine.dispose()


def test_a_schedule_change_reaches_every_replica(tmp_path):
    """A replica restarted with another epoch length stores the new schedule; the others
    read it within a refresh, before the boundary it takes effect at."""
    url = f"sqlite:///{tmp_path / 'ks.db'}"
    upgrade(url)
    sessions = make_sessions(make_engine(url))
    with sessions.begin() as session:
        first = load_clock(session, time.time(), 60, 10)
    other = SharedClock(sessions, first, refresh=0.05)
    try:
        now = time.time()
        with sessions.begin() as session:
            changed = load_clock(session, now, 30, 5)
        assert changed.segments[-1].start >= now + 5  # the lead before it takes effect
        deadline = time.monotonic() + 2
        while other.current != changed:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        other.close()


def test_bench_keyserver_with_replicas_smoke(postgres_url, tmp_path):
    out = tmp_path / "replicas.json"
    bench = cli_command("bench", "keyserver", "--json", str(out), "--replicas", "2",
                        "--seconds", "1", "--clients", "2", "--max-credentials", "1",
                        "--postgres-url", postgres_url)
    done = subprocess.run(bench, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["keys_per_second_1"] > 0 and summary["keys_per_second_2"] > 0
    assert summary["ratio"] == pytest.approx(
        summary["keys_per_second_2"] / summary["keys_per_second_1"], rel=0.01)
    refused = subprocess.run([*bench, "--cores", "0"], env=child_env(), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("ibe-pubsub: error: --cores lists 1 cores for 2 "
                                      "replicas")


def test_a_replica_killed_mid_burst_loses_nothing_it_answered(replicas):
    """Runs last: it kills replica A."""
    a, b = replicas
    tokens = {}
    with b.admin() as admin:
        for i in range(4):
            tokens[f"burst-{i}"] = admin.create_identity(f"burst-{i}", "subscriber")["token"]
    answered: Counter[str] = Counter()
    attempted: Counter[str] = Counter()
    created: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 60  # moved to 1.8 s after the kill

    def enrol_loop(name: str, replica: Replica) -> None:
        while time.monotonic() < stop_at:
            with lock:
                attempted[name] += 1
            try:
                _enrol(replica, tokens[name])()
            except KeyServerRequestError:
                continue
            with lock:
                answered[name] += 1

    def create_loop(replica: Replica, tag: str) -> None:
        for i in itertools.count():
            if time.monotonic() >= stop_at:
                return
            try:
                with replica.admin() as admin:
                    created.append(admin.create_identity(f"burst-new-{tag}-{i}",
                                                         "subscriber")["name"])
            except KeyServerRequestError:
                pass

    threads = [threading.Thread(target=enrol_loop, args=(n, r))
               for n, r in zip(tokens, (a, b, a, b), strict=True)]
    threads += [threading.Thread(target=create_loop, args=(r, t)) for r, t in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    # Killed once it has answered an enrolment and created an identity (1.2 s on a quiet
    # machine), so that the check below is about what it answered.
    deadline = time.monotonic() + 30
    while not (answered["burst-0"] and any(n.startswith("burst-new-a-") for n in created)):
        assert time.monotonic() < deadline, "replica A answered nothing in 30 s"
        time.sleep(0.05)
    a.process.send_signal(signal.SIGKILL)
    a.process.wait()
    stop_at = time.monotonic() + 1.8
    for t in threads:
        t.join()
    assert answered["burst-0"] and any(n.startswith("burst-new-a-") for n in created)
    with b.admin() as admin:
        audited = Counter(e["detail"]["identity"] for e in _audit(admin)
                          if e["action"] == "issue_subscriber")
        listed = {i["name"] for i in admin.list_identities()}
    for name in tokens:
        assert answered[name] <= audited[name] <= attempted[name], name
    assert set(created) <= listed
