"""The key server's HTTP API against a real uvicorn (shared session server)."""

from __future__ import annotations

import base64
import itertools
import re
import socket
import struct
import threading
import time

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.certificates import fingerprint
from ibe_pubsub.credentials.scheme import (
    Event,
    check_connection_request,
    decrypt,
    encrypt_and_sign,
    open_connection_request,
    verify,
)
from ibe_pubsub.credentials.server_keys import Ed25519Server
from ibe_pubsub.evaluation.launcher import free_port
from ibe_pubsub.keyserver.bundles import (
    BundleError,
    decode_params,
    decode_publisher_bundle,
    decode_root_certificate,
    decode_subscriber_bundle,
)
from ibe_pubsub.keyserver.client import (
    KEEPALIVE_SECONDS,
    KeyServerClient,
    KeyServerRequestError,
)

SUBSCRIPTION = 'symbol prefix "IB" and price in [10, 20]'
_names = itertools.count()


def _admin(ks) -> KeyServerClient:
    return KeyServerClient(ks.base_url, ks.admin_token, retries=0)


def _identity(ks, role: str, policy: str | None = None) -> tuple[KeyServerClient, dict]:
    created = _admin(ks).create_identity(f"{role}-{next(_names)}", role, policy)
    return KeyServerClient(ks.base_url, created["token"], retries=0), created


def _status(call) -> KeyServerRequestError:
    with pytest.raises(KeyServerRequestError) as info:
        call()
    body = info.value.body
    assert set(body) == {"error"} and body["error"]["status"] == info.value.status
    assert body["error"]["message"] and body["error"]["code"]
    return info.value


def _raw_key(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw)


def _certify(client: KeyServerClient, *addresses: str) -> dict:
    """A peer-link certificate of a fresh key, making ``addresses`` the identity's own."""
    key = base64.b64encode(_raw_key(Ed25519PrivateKey.generate())).decode()
    return client.enrol_transport(key, addresses)


def test_params_are_signed_and_decode(keyserver):
    doc = KeyServerClient(keyserver.base_url).params()
    params = decode_params(load_group(), doc)
    assert params.pp.schema.id == doc["schema_id"] and len(params.server_key) == 32
    assert params.epoch_start <= time.time() < params.epoch_end
    pinned = b"\x01" * 32
    presented = fingerprint(base64.b64decode(doc["server_key"]))
    with pytest.raises(BundleError, match=f"presents signing key {re.escape(presented)}, not "
                       f"the pinned {re.escape(fingerprint(pinned))}"):
        decode_params(load_group(), doc, server_key=pinned)
    assert decode_params(load_group(), doc, server_key=params.server_key).pp.schema.id == \
        doc["schema_id"]
    tampered = dict(doc, schema_signature=base64.b64encode(b"\x00" * 64).decode())
    with pytest.raises(BundleError):
        decode_params(load_group(), tampered)


def test_issued_keys_encrypt_decrypt_and_requests_verify(keyserver):
    group = load_group()
    params = decode_params(group, KeyServerClient(keyserver.base_url).params())
    subscriber, _ = _identity(keyserver, "subscriber")
    publisher, _ = _identity(keyserver, "publisher")
    sub = decode_subscriber_bundle(group, subscriber.enrol_subscriber(SUBSCRIPTION,
                                                                      max_credentials=4))
    pub = decode_publisher_bundle(group, publisher.enrol_publisher(""))
    assert sub.epoch == pub.epoch == params.epoch
    assert [str(c) for c in sub.credentials["symbol"]] == ['symbol:"IB"']
    assert len(sub.key.fine_tokens) > 0 and len(sub.requests) == len(sub.key.credentials)

    pp = params.pp
    event = encrypt_and_sign(pp, pub.keys, Event("e1", {"symbol": "IBM", "price": 15.0,
                                                        "volume": 500}, b"hello"))
    assert verify(pp, event)
    assert decrypt(pp, sub.key, event).body == b"hello"

    server_key = params.server
    for issued in sub.requests:
        check_connection_request(pp, issued.request, server_key, time.time(), {sub.epoch})
        assert len(issued.secrets) == issued.credential.position + 1
        assert len(issued.request.entries) == pp.schema.attribute(issued.attribute).positions
    # A holder of the whole-domain price credential opens every price request at position 0,
    # and learns the requester's position.
    wide = decode_subscriber_bundle(group, _identity(keyserver, "subscriber")[0]
                                    .enrol_subscriber("", fine_depth=0))
    wide_price = wide.key.for_attribute("price")[0]
    request = next(r for r in sub.requests if r.attribute == "price")
    opening = open_connection_request(pp, wide_price.token, request.request)
    assert opening is not None and opening.sw == request.secrets[0]
    assert opening.position == request.credential.position


def test_policy_bounds_enrolment_with_403_naming_the_clause(keyserver):
    client, created = _identity(keyserver, "subscriber", "price <= 100 and symbol prefix \"I\"")
    assert created["policy"] == 'symbol prefix "I" and price <= 100.0'
    client.enrol_subscriber('symbol = "IBM" and price in [1, 50]', fine_depth=0)
    err = _status(lambda: client.enrol_subscriber("price in [50, 150]"))
    assert err.status == 403 and err.code == "outside_policy"
    assert err.body["error"]["detail"]["clause"] in ('symbol prefix "I"', "price <= 100.0")
    err = _status(lambda: client.enrol_subscriber('symbol prefix "I" and price >= 50'))
    assert err.body["error"]["detail"]["clause"] == "price <= 100.0"
    publisher, _ = _identity(keyserver, "publisher", 'symbol = "ACME"')
    err = _status(lambda: publisher.enrol_publisher('symbol = "IBM"'))
    assert err.status == 403 and "ACME" in err.body["error"]["message"]


@pytest.mark.parametrize("body", [
    {"subscription": "volume in [5"},
    {"subscription": "colour = 3"},
    {"subscription": "price in [20, 10]"},
    {"subscription": 42},
    {"subscription": "price < 5", "surprise": 1},
    {"subscription": "price < 5", "fine_depth": -1},
    {"subscription": "price < 5", "epoch": "previous"},
    {},
])
def test_bad_enrolment_bodies_are_422(keyserver, body):
    client, _ = _identity(keyserver, "subscriber")
    err = _status(lambda: client.request("POST", "/v1/enrol/subscriber", json=body))
    assert err.status == 422


def test_malformed_json_is_422(keyserver):
    client, _ = _identity(keyserver, "subscriber")
    err = _status(lambda: client.request("POST", "/v1/enrol/subscriber", content=b"{nope",
                                         headers={"content-type": "application/json"}))
    assert err.status == 422


def test_missing_or_invalid_tokens_are_401(keyserver):
    anonymous = KeyServerClient(keyserver.base_url, retries=0)
    forged = KeyServerClient(keyserver.base_url, "sub_not-a-token", retries=0)
    subscriber, _ = _identity(keyserver, "subscriber")
    for call in (lambda: anonymous.enrol_subscriber("price < 5"),
                 lambda: forged.enrol_subscriber("price < 5"),
                 lambda: anonymous.list_identities(),
                 lambda: subscriber.list_identities(),  # an identity is no admin
                 lambda: forged.lookup("price")):
        err = _status(call)
        assert err.status == 401


def test_oversized_body_is_413(keyserver):
    client, _ = _identity(keyserver, "subscriber")
    err = _status(lambda: client.request("POST", "/v1/enrol/subscriber",
                                         content=b"x" * (17 * 1024 * 1024),
                                         headers={"content-type": "application/json"}))
    assert err.status == 413


def test_roles_are_enforced(keyserver):
    subscriber, _ = _identity(keyserver, "subscriber")
    publisher, _ = _identity(keyserver, "publisher")
    assert _status(lambda: subscriber.enrol_publisher("")).status == 403
    assert _status(lambda: publisher.enrol_subscriber("")).status == 403
    key = base64.b64encode(_raw_key(Ed25519PrivateKey.generate())).decode()
    assert _status(lambda: subscriber.enrol_root("price", key)).status == 403
    # the role is checked before the epoch: 403, not 409 outside the grace window
    assert _status(lambda: subscriber.enrol_root("price", key, "next")).status == 403
    assert _status(lambda: subscriber.register("127.0.0.1:9000", "price", "root", 60)
                   ).status == 403


def test_root_certificate_binds_attribute_key_and_epoch(keyserver):
    root, _ = _identity(keyserver, "root")
    server_key = Ed25519Server(base64.b64decode(
        KeyServerClient(keyserver.base_url).params()["server_key"]))
    transport = _raw_key(Ed25519PrivateKey.generate())
    doc = root.enrol_root("price", base64.b64encode(transport).decode())
    cert = decode_root_certificate(doc, server_key)
    assert (cert.attribute, cert.transport_key) == ("price", transport)
    assert cert.expires_at > time.time()
    with pytest.raises(BundleError):
        decode_root_certificate(dict(doc, attribute="volume"), server_key)
    assert _status(lambda: root.enrol_root("colour", doc["transport_key"])).status == 422
    assert _status(lambda: root.enrol_root("price", "AAAA")).status == 422
    assert _status(lambda: root.enrol_root("price", "not base64!")).status == 422
    bounded, _ = _identity(keyserver, "root", "price < 10")
    assert _status(lambda: bounded.enrol_root("price", doc["transport_key"])).status == 403
    bounded.enrol_root("volume", doc["transport_key"])


def test_revoked_identity_gets_403_and_leaves_the_directory(keyserver):
    admin = _admin(keyserver)
    client, created = _identity(keyserver, "subscriber")
    certificate = _certify(client, "127.0.0.1:7001")
    client.register("127.0.0.1:7001", "volume", "subscriber", 600)
    assert "127.0.0.1:7001" in [m["address"] for m in admin.lookup("volume", 100)["members"]]
    revoked = admin.revoke(created["id"])
    assert revoked["revoked_epoch"] is not None
    err = _status(lambda: client.enrol_subscriber("price < 5"))
    assert (err.status, err.code) == (403, "revoked")
    assert "127.0.0.1:7001" not in [m["address"] for m in admin.lookup("volume", 100)["members"]]
    # its address stays blocked until its certificate naming it expires (which is still
    # valid): another identity is refused it until then
    other = _identity(keyserver, "subscriber")[0]
    err = _status(lambda: _certify(other, "127.0.0.1:7001"))
    assert (err.status, err.code) == (409, "address_taken")
    assert err.body["error"]["detail"] == {"address": "127.0.0.1:7001",
                                           "until": certificate["not_after"]}
    assert admin.revoke(created["id"])["revoked_at"] == revoked["revoked_at"]
    assert _status(lambda: admin.revoke(10**6)).status == 404


def test_directory_lists_roots_and_samples_live_members(keyserver):
    root, _ = _identity(keyserver, "root")
    _certify(root, "10.0.0.1:9000")
    root.register("10.0.0.1:9000", "symbol", "root", 600)
    members = [_identity(keyserver, "subscriber")[0] for _ in range(4)]
    for i, m in enumerate(members):
        _certify(m, f"10.0.0.{i + 2}:9000", *(["10.0.0.99:9000"] if i == 0 else []))
        m.register(f"10.0.0.{i + 2}:9000", "symbol", "subscriber", 600)
    members[0].register("10.0.0.99:9000", "symbol", "subscriber", 1)
    members[1].enrol_subscriber('symbol = "IBM"')  # a subscriber looks up the trees it joins
    time.sleep(1.2)
    found = members[1].lookup("symbol", sample=3)
    assert [r["address"] for r in found["roots"]] == ["10.0.0.1:9000"]
    assert len(found["members"]) == 3
    everyone = {m["address"] for m in members[1].lookup("symbol", sample=100)["members"]}
    assert everyone >= {f"10.0.0.{i + 2}:9000" for i in range(4)}
    assert "10.0.0.99:9000" not in everyone
    assert _status(lambda: members[1].lookup("colour")).status == 422
    for bad in (("nohost", "symbol", "subscriber", 60), ("h:1", "colour", "subscriber", 60),
                ("h:1", "symbol", "subscriber", 0)):
        assert _status(lambda bad=bad: members[1].register(*bad)).status == 422


def _bulk_items(name: str) -> list[dict]:
    return [{"identity": name, "role": "subscriber", "credentials": [
        {"attribute": "price", "credential": "price:0101", "fine": False, "position": 4},
        {"attribute": "price", "credential": "price:01010", "fine": True, "position": 5},
        {"attribute": "symbol", "credential": 'symbol:"IB"', "fine": False, "position": 2},
        {"attribute": "volume", "credential": "volume:*", "fine": False, "position": 0}]},
        {"identity": name + "-pub", "role": "publisher", "credentials": [
            {"attribute": "price", "credential": "price:*", "fine": False, "position": 0}]}]


def test_bulk_issuance_is_idempotent_by_chunk_id(keyserver):
    admin = _admin(keyserver)
    name = f"bulk-{next(_names)}"
    first = admin.bulk(f"chunk-{name}", _bulk_items(name))
    again = admin.bulk(f"chunk-{name}", _bulk_items(name))
    assert first == again
    sub, pub = first["bundles"]
    assert sub["credentials"]["price"] == ["price:0101"]
    assert sub["fine_credentials"] == {"price": ["price:01010"]}
    assert len(decode_subscriber_bundle(load_group(), sub).key.credentials) == 3
    assert len(decode_publisher_bundle(load_group(), pub).keys) == 1
    issued = [e for e in admin.audit(limit=1000) if e["action"] == "issue_bulk"
              and e["detail"]["chunk_id"] == f"chunk-{name}"]
    assert len(issued) == 2
    assert {i["name"] for i in admin.list_identities()} >= {name, name + "-pub"}
    assert _status(lambda: admin.bulk(f"chunk-{name}", _bulk_items(name)[:1])).status == 409


@pytest.mark.parametrize("credential", [
    {"attribute": "price", "credential": "price:0102", "fine": False, "position": 4},
    {"attribute": "price", "credential": "price:0101", "fine": False, "position": 3},
    {"attribute": "volume", "credential": "price:0101", "fine": False, "position": 4},
    {"attribute": "colour", "credential": "colour:01", "fine": False, "position": 2},
    {"attribute": "price", "credential": "price:" + "0" * 17, "fine": False, "position": 17},
    {"attribute": "price", "credential": 'price:"IB"', "fine": False, "position": 2},
])
def test_bulk_rejects_bad_credentials_with_422(keyserver, credential):
    admin = _admin(keyserver)
    item = {"identity": "bulk-bad", "role": "subscriber", "credentials": [credential]}
    assert _status(lambda: admin.bulk(f"bad-{next(_names)}", [item])).status == 422


def test_bulk_reports_revoked_and_mismatched_identities_per_item(keyserver):
    admin = _admin(keyserver)
    _, created = _identity(keyserver, "subscriber")
    admin.revoke(created["id"])
    items = _bulk_items(created["name"])
    items[1]["identity"] = created["name"]  # a publisher item for a subscriber identity
    out = admin.bulk(f"chunk-r-{next(_names)}", items)
    assert [b.get("error") for b in out["bundles"]] == ["identity is revoked"] * 2


def test_audit_log_records_admin_actions_and_issuance(keyserver):
    admin = _admin(keyserver)
    start = max([e["id"] for e in admin.audit(limit=1000)], default=0)
    client, created = _identity(keyserver, "publisher")
    client.enrol_publisher("price < 10")
    entries = admin.audit(after=start, limit=1000)
    mine = [e for e in entries if e["detail"].get("identity") == created["name"]]
    assert [e["action"] for e in mine] == ["create_identity", "issue_publisher"]
    assert mine[0]["actor"] == "admin" and mine[1]["actor"] == created["name"]
    assert mine[1]["detail"]["credentials"]["price"] and mine[1]["epoch"] >= 1


def test_identity_names_are_unique(keyserver):
    admin = _admin(keyserver)
    admin.create_identity("unique-name", "subscriber")
    assert _status(lambda: admin.create_identity("unique-name", "publisher")).status == 409
    assert _status(lambda: admin.create_identity("x", "subscriber", "price in")).status == 422
    assert _status(lambda: admin.create_identity("bad name", "subscriber")).status == 422


def test_next_epoch_keys_only_in_the_grace_window(keyserver):
    client, _ = _identity(keyserver, "subscriber")
    err = _status(lambda: client.enrol_subscriber("price < 5", epoch="next"))
    assert (err.status, err.code) == (409, "not_in_grace")


def test_health_metrics_openapi_and_error_shape(keyserver):
    assert KeyServerClient(keyserver.base_url).health()["status"] == "ok"
    text = KeyServerClient(keyserver.base_url).metrics()
    assert 'ibe_keyserver_keys_issued_total{kind="subscriber_credential"}' in text
    assert "ibe_keyserver_request_seconds_bucket" in text
    spec = httpx.get(keyserver.base_url + "/openapi.json").json()
    assert "/v1/enrol/subscriber" in spec["paths"]
    for method, path, status in (("GET", "/v1/nowhere", 404), ("DELETE", "/v1/params", 405)):
        r = httpx.request(method, keyserver.base_url + path)
        assert r.status_code == status and r.json()["error"]["status"] == status


def _count(metrics: str, line_prefix: str) -> int:
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in metrics.splitlines()
               if line.startswith(line_prefix))


def test_client_retries_connection_errors_but_not_4xx(keyserver):
    down = KeyServerClient(f"http://127.0.0.1:{free_port()}", retries=2, backoff=0.01)
    with pytest.raises(KeyServerRequestError) as info:
        down.health()
    assert info.value.status == 0
    assert str(info.value) == f"cannot reach the key server at {down.base_url}: connection refused"
    assert info.value.down  # worth waiting for
    # A server killed while it answers resets or closes the connection: down too (a peer
    # starting then waits for it; it exited before, in a soak). Control below: a 401 is not.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def end_each(linger: bool) -> None:
            for _ in range(3):
                conn, _ = listener.accept()
                if linger:  # an RST instead of a FIN
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    struct.pack("ii", 1, 0))
                conn.recv(1024)
                conn.close()

        for linger, said in ((True, "reset"), (False, "closed without an answer")):
            ender = threading.Thread(target=end_each, args=(linger,), daemon=True)
            ender.start()
            gone = KeyServerClient(f"http://127.0.0.1:{listener.getsockname()[1]}",
                                   retries=2, backoff=0.01)
            with pytest.raises(KeyServerRequestError, match=said) as info:
                gone.health()
            assert info.value.down
            ender.join(10)
    public = KeyServerClient(keyserver.base_url)
    prefix = ('ibe_keyserver_requests_total{method="GET",route="/v1/admin/identities",'
              'status="401"}')
    before = _count(public.metrics(), prefix)
    with pytest.raises(KeyServerRequestError) as refused:
        KeyServerClient(keyserver.base_url, "wrong", retries=3).list_identities()
    assert _count(public.metrics(), prefix) == before + 1
    assert refused.value.status == 401 and not refused.value.down


def test_client_drops_an_idle_connection_before_the_server_would_close_it():
    """A server closes a keep-alive connection once idle for its timeout (uvicorn: 5 s,
    httpx's own expiry too), and a request sent on it at that moment gets no answer (a
    full run failed so, without retries). This server answers a request on a connection
    idle for longer than KEEPALIVE_SECONDS by closing it: the client must have opened a
    new one. The control: a request soon after another reuses its connection."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    connections: list[int] = []

    def serve(conn: socket.socket, k: int) -> None:
        with conn:
            last = time.monotonic()
            while (data := conn.recv(65536)) and b"\r\n\r\n" in data:
                if time.monotonic() - last > KEEPALIVE_SECONDS:
                    return  # closing it as idle: no answer
                connections[k] += 1  # before the answer, which the client may act on at once
                conn.sendall(answer)
                last = time.monotonic()

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                connections.append(0)
                threading.Thread(target=serve, args=(conn, len(connections) - 1),
                                 daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        client = KeyServerClient(f"http://127.0.0.1:{listener.getsockname()[1]}", retries=0)
        assert client.health() == {} and client.health() == {}
        assert connections == [2]  # the control: reused
        time.sleep(KEEPALIVE_SECONDS + 0.5)
        assert client.health() == {}
        assert connections == [2, 1]
        client.close()


def test_request_metrics_label_a_fixed_set_of_methods(keyserver):
    """An invented method becomes method="other", never a series of its own; a GET is
    counted under its name (the control)."""
    prefix = 'ibe_keyserver_requests_total{method="%s",route="unmatched",status="404"}'
    public = KeyServerClient(keyserver.base_url)
    before = public.metrics()
    with socket.create_connection(("127.0.0.1", httpx.URL(keyserver.base_url).port),
                                  timeout=5) as raw:
        raw.sendall(b"FOO123 /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 ")
        while raw.recv(4096):
            pass
    assert httpx.get(keyserver.base_url + "/nowhere").status_code == 404
    after = public.metrics()
    assert "FOO123" not in after
    for method in ("other", "GET"):
        assert _count(after, prefix % method) == _count(before, prefix % method) + 1
