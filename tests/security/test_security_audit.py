"""Refusals are audited, against real servers: one refusal of each status (401, 403, 409,
413, 422, 429), from the middleware and from the handlers, is found in the audit log with
its reason, route, client address and caller, and never with the token that was refused
(nor its hash) anywhere in the database. A flood of refusals is audited or counted, and
identity names that would pass for the server's own actors are refused.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from keyserver_fixtures import bearer_client

from ibe_pubsub.keyserver.client import KeyServerClient
from ibe_pubsub.keyserver.db import AuditEntry, sqlite_url
from ibe_pubsub.keyserver.keystore import token_hash
from ibe_pubsub.keyserver.refusals import RefusalLog
from ibe_pubsub.keyserver.state import open_database

ENROL = "/v1/enrol/subscriber"
AUDIT_WAIT = 10.0


def _all_entries(admin: httpx.Client) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    while True:
        page = admin.get("/v1/admin/audit", params={"after": entries[-1]["id"] if entries else 0,
                                                    "limit": 1000}).json()
        if not page:
            return entries
        entries += page


def _wait_for(admin: httpx.Client, done: Callable[[list[dict[str, Any]]], bool]
              ) -> list[dict[str, Any]]:
    """The audit log once ``done`` holds for it (it is written in the background)."""
    deadline = time.monotonic() + AUDIT_WAIT
    while True:
        entries = _all_entries(admin)
        if done(entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.2)




def _stored_bytes(data_dir: Path) -> bytes:
    """Everything the SQLite database holds on disk, write-ahead log included."""
    return b"".join(p.read_bytes() for p in sorted(data_dir.glob("keyserver.db*")))


def test_every_refusal_is_audited_with_reason_route_address_and_caller(keyserver_factory):
    server = keyserver_factory.start(serve_args=("--workers", "1", "--key-rate", "0.2",
                                                 "--key-burst", "50"))
    admin = bearer_client(server.base_url, server.admin_token)
    created = {name: admin.post("/v1/admin/identities",
                                json={"name": name, "role": "subscriber"}).json()
               for name in ("alice", "bob")}
    alice = bearer_client(server.base_url, created["alice"]["token"])
    bob = bearer_client(server.base_url, created["bob"]["token"])
    refused_token = "sub_" + secrets.token_urlsafe(32)
    stranger = bearer_client(server.base_url, refused_token)
    assert admin.post(f"/v1/admin/identities/{created['bob']['id']}/revoke").status_code == 200

    probes = {  # (status, code, actor, route): the answer
        (401, "unauthorized", "anonymous", ENROL):
            stranger.post(ENROL, json={"subscription": "price < 5"}),
        (403, "revoked", "bob", ENROL): bob.post(ENROL, json={"subscription": "price < 5"}),
        (403, "wrong_role", "alice", "/v1/enrol/publisher"):
            alice.post("/v1/enrol/publisher", json={"advertisement": "price < 5"}),
        (409, "not_in_grace", "alice", ENROL):
            alice.post(ENROL, json={"subscription": "price < 5", "epoch": "next"}),
        (409, "exists", "admin", "/v1/admin/identities"):
            admin.post("/v1/admin/identities", json={"name": "alice", "role": "subscriber"}),
        (413, "body_too_large", "alice", ENROL):
            alice.post(ENROL, content=b" " * (65 * 1024),
                       headers={"Content-Type": "application/json"}),
        (422, "invalid", "alice", ENROL): alice.post(ENROL, json={}),
        (422, "reserved_name", "admin", "/v1/admin/identities"):
            admin.post("/v1/admin/identities", json={"name": "Admin", "role": "subscriber"}),
    }
    for _ in range(2):  # 36 keys each: the second one exceeds the burst of 50 keys
        metered = alice.post(ENROL, json={"subscription": "price in [10, 20]"})
    probes[(429, "rate_limited", "alice", ENROL)] = metered
    for (status, code, _, _), answer in probes.items():
        assert answer.status_code == status and answer.json()["error"]["code"] == code

    def found(entries: list[dict[str, Any]]) -> dict[tuple[int, str, str, str], dict]:
        return {(d["status"], d["code"], e["actor"], d["route"]): e for e in entries
                if e["action"] == "refuse" and (d := e["detail"])}

    entries = _wait_for(admin, lambda entries: set(probes) <= set(found(entries)))
    refusals = found(entries)
    missing = set(probes) - set(refusals)
    assert not missing, f"refusals not audited: {missing}"
    for key in probes:
        detail = refusals[key]["detail"]
        assert detail["client"] == "127.0.0.1" and detail["method"] == "POST"
        assert detail["message"] == probes[key].json()["error"]["message"]
    print(f"{len(probes)} refusals, all audited: {sorted(probes)}")

    # the refused token is a secret: not in the log, not anywhere in the database
    secret_forms = (refused_token, token_hash(refused_token))
    dumped = json.dumps(entries)
    stored = _stored_bytes(server.data_dir)
    for form in secret_forms:
        assert form not in dumped
        assert form.encode() not in stored
    # control: the same search finds a token hash the database does hold (alice's)
    assert token_hash(created["alice"]["token"]).encode() in stored


def test_a_flood_of_refusals_is_audited_or_counted(keyserver_factory):
    server = keyserver_factory.start(serve_args=("--workers", "1", "--address-rate", "1e6",
                                                 "--address-burst", "1000000"))
    threads, per_thread, statuses = 8, 150, []
    lock = threading.Lock()

    def flood() -> None:
        with httpx.Client(base_url=server.base_url) as client:
            got = [client.post("/v1/enrol/root", json={}).status_code
                   for _ in range(per_thread)]
        with lock:
            statuses.extend(got)

    start = time.monotonic()
    workers = [threading.Thread(target=flood) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    elapsed = time.monotonic() - start
    assert statuses == [401] * threads * per_thread

    def accounted(entries: list[dict[str, Any]]) -> tuple[int, int]:
        audited = sum(1 for e in entries if e["action"] == "refuse"
                      and e["detail"]["route"] == "/v1/enrol/root")
        dropped = sum(e["detail"]["dropped"] for e in entries
                      if e["action"] == "refuse_dropped")
        return audited, dropped

    admin = bearer_client(server.base_url, server.admin_token)
    entries = _wait_for(admin, lambda e: sum(accounted(e)) >= len(statuses))
    audited, dropped = accounted(entries)
    print(f"{len(statuses)} refusals in {elapsed:.1f} s: {audited} audited, {dropped} counted "
          "as dropped")
    assert audited + dropped == len(statuses)


def test_refusals_beyond_the_queue_are_counted_in_a_later_entry(tmp_path):
    engine, sessions, _ = open_database(sqlite_url(str(tmp_path / "audit.db")), 3600, 300)
    log = RefusalLog(sessions, capacity=2)
    for i in range(500):
        log.record("anonymous", 1, {"status": 401, "n": i})
    log.close()
    with sessions() as session:
        rows = session.query(AuditEntry).all()
    engine.dispose()
    audited = [r for r in rows if r.action == "refuse"]
    counts = [r for r in rows if r.action == "refuse_dropped"]
    dropped = sum(r.detail["dropped"] for r in counts)
    print(f"queue of 2, 500 refusals: {len(audited)} written, {dropped} counted as dropped")
    assert dropped > 0 and {r.actor for r in counts} == {"keyserver"}
    assert len(audited) + dropped == 500


def test_identity_names_of_the_servers_own_actors_are_refused(keyserver):
    admin = KeyServerClient(keyserver.base_url, keyserver.admin_token, retries=0)
    with bearer_client(keyserver.base_url, keyserver.admin_token) as client:
        for name in ("admin", "Admin", "ADMIN", "anonymous", "KeyServer"):
            answer = client.post("/v1/admin/identities",
                                 json={"name": name, "role": "subscriber"})
            assert answer.status_code == 422, name
            assert answer.json()["error"]["code"] == "reserved_name"
        bulk = client.post("/v1/admin/bulk", json={"chunk_id": secrets.token_hex(8), "items": [
            {"identity": "aDmin", "role": "subscriber", "credentials": [
                {"attribute": "symbol", "credential": "symbol:", "position": 0}]}]})
        assert bulk.status_code == 422 and bulk.json()["error"]["code"] == "reserved_name"
    # control: names merely close to them are fine
    suffix = secrets.token_hex(3)
    for name in (f"admin{suffix}", f"the-admin-{suffix}"):
        assert admin.create_identity(name, "subscriber")["name"] == name


def test_rate_limit_refusals_are_coalesced_and_every_one_is_counted(tmp_path):
    """A flood of 429s from one caller and address becomes two rows (the first, then a
    count when the window closes), not one row per request; other callers and statuses
    are not coalesced. Control: 401s from the same flood are written one by one."""
    engine, sessions, _ = open_database(sqlite_url(str(tmp_path / "audit.db")), 3600, 300)
    log = RefusalLog(sessions, window=0.5)
    for i in range(300):
        log.record("anonymous", 1, {"status": 429, "client": "10.0.0.1", "n": i})
        log.record("alice", 1, {"status": 429, "client": "10.0.0.1", "n": i})
    for i in range(20):
        log.record("anonymous", 1, {"status": 401, "client": "10.0.0.1", "n": i})
    time.sleep(1.0)
    log.record("anonymous", 1, {"status": 429, "client": "10.0.0.1", "n": 300})  # new window
    log.close()
    with sessions() as session:
        rows = session.query(AuditEntry).filter(AuditEntry.action == "refuse").all()
    engine.dispose()
    limited = [r for r in rows if r.detail["status"] == 429]
    by_actor = {actor: sum(r.detail.get("count", 1) for r in limited if r.actor == actor)
                for actor in ("anonymous", "alice")}
    assert by_actor == {"anonymous": 301, "alice": 300}
    assert len(limited) == 5  # anonymous: first, count, new first; alice: first, count
    assert sum(1 for r in rows if r.detail["status"] == 401) == 20
