"""Text that is no text never gets a 5xx from the key server.

A lone UTF-16 surrogate (``\\ud800``) is valid JSON but cannot be encoded as UTF-8, so once
inside the server it used to break hashing, the database or the JSON answer (500, and the
keep-alive connection dropped). It can arrive three ways: as a JSON escape in any string
field, as raw bytes (``ED A0 80``, which Python's JSON reader lets through), or as a
``\\uXXXX`` escape inside a predicate. Each entry point is probed against a real server and
must answer 422 with the JSON error body, on the same connection that then keeps serving;
each probe has a control showing it reaches the check (the same request with valid text
in place of the surrogate succeeds).
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.evaluation.postgres import fresh_database

LONE = "\ud800"
LONE_ESCAPE = "\\ud800"  # the predicate language's escape, as typed
PAIR_ESCAPE = "\\ud83d\\ude00"  # a surrogate pair of escapes: one valid character
_names = itertools.count()


def _unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


@dataclass(frozen=True)
class Probe:
    """A request into one entry point with ``text`` spliced into one of its strings."""

    entry: str
    role: str  # whose token: admin, subscriber, publisher or root
    path: str
    body: Callable[[str], dict[str, Any]]
    lone: str  # what makes the request invalid
    valid: str  # the control: the same request with this instead must succeed


def _bulk(credential: str = 'symbol:"IB"', attribute: str = "symbol", identity: str = "",
          chunk: str = "") -> dict[str, Any]:
    return {"chunk_id": _unique("surrogate-chunk") + chunk,
            "items": [{"identity": _unique("surrogate-bulk") + identity, "role": "subscriber",
                       "credentials": [{"attribute": attribute, "credential": credential,
                                        "position": 2}]}]}


ROOT_KEY = base64.b64encode(bytes(range(32))).decode()
PROBES = [
    Probe("subscription escape", "subscriber", "/v1/enrol/subscriber",
          lambda s: {"subscription": f'symbol = "{s}"'}, LONE_ESCAPE, PAIR_ESCAPE),
    Probe("subscription JSON", "subscriber", "/v1/enrol/subscriber",
          lambda s: {"subscription": f'symbol = "A{s}"'}, LONE, "\U0001f600"),
    Probe("advertisement escape", "publisher", "/v1/enrol/publisher",
          lambda s: {"advertisement": f'symbol = "{s}" and price = 10 and volume = 5'},
          LONE_ESCAPE, PAIR_ESCAPE),
    Probe("advertisement JSON", "publisher", "/v1/enrol/publisher",
          lambda s: {"advertisement": f'symbol = "A{s}" and price = 10 and volume = 5'},
          LONE, "\U0001f600"),
    Probe("identity name", "admin", "/v1/admin/identities",
          lambda s: {"name": _unique("surrogate-name") + s, "role": "subscriber"}, LONE, ""),
    Probe("policy escape (--allow)", "admin", "/v1/admin/identities",
          lambda s: {"name": _unique("surrogate-policy"), "role": "subscriber",
                     "policy": f'symbol prefix "{s}"'}, LONE_ESCAPE, PAIR_ESCAPE),
    Probe("policy JSON (--allow)", "admin", "/v1/admin/identities",
          lambda s: {"name": _unique("surrogate-policy"), "role": "subscriber",
                     "policy": f'symbol prefix "A{s}"'}, LONE, "\U0001f600"),
    Probe("directory address", "subscriber", "/v1/directory",
          lambda s: {"address": f"peer{s}.example:4000", "attribute": "symbol",
                     "role": "subscriber", "ttl": 60}, LONE, ""),
    Probe("directory attribute", "subscriber", "/v1/directory",
          lambda s: {"address": "peer.example:4000", "attribute": "symbol" + s,
                     "role": "subscriber", "ttl": 60}, LONE, ""),
    Probe("transport address", "subscriber", "/v1/enrol/transport",
          lambda s: {"public_key": ROOT_KEY, "addresses": [f"peer{s}.example:4001"]}, LONE, ""),
    Probe("bulk chunk id", "admin", "/v1/admin/bulk", lambda s: _bulk(chunk=s), LONE, ""),
    Probe("bulk identity", "admin", "/v1/admin/bulk", lambda s: _bulk(identity=s), LONE, ""),
    Probe("bulk attribute", "admin", "/v1/admin/bulk",
          lambda s: _bulk(attribute="symbol" + s), LONE, ""),
    Probe("bulk credential", "admin", "/v1/admin/bulk",
          lambda s: _bulk(credential=f'symbol:"IB{s}"'), LONE, ""),
    Probe("root attribute", "root", "/v1/enrol/root",
          lambda s: {"attribute": "symbol" + s, "transport_key": ROOT_KEY}, LONE, ""),
]


@pytest.fixture(scope="module")
def tokens(keyserver) -> dict[str, str]:
    with httpx.Client(base_url=keyserver.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {keyserver.admin_token}"}) as admin:
        out = {role: admin.post("/v1/admin/identities",
                                json={"name": _unique(f"surrogate-{role}"), "role": role}
                                ).json()["token"]
               for role in ("subscriber", "publisher", "root")}
        # the directory probes' control registers this address: it must be the subscriber's
        certified = admin.post("/v1/enrol/transport",
                               headers={"Authorization": f"Bearer {out['subscriber']}"},
                               json={"public_key": ROOT_KEY, "addresses": ["peer.example:4000"]})
        assert certified.status_code == 200, certified.text
    return out | {"admin": keyserver.admin_token}


@pytest.fixture(scope="module")
def connection(keyserver) -> Iterator[httpx.Client]:
    """One persistent client: every request of this module should travel on one connection."""
    with httpx.Client(base_url=keyserver.base_url, timeout=60) as client:
        yield client


def _local_port(response: httpx.Response) -> int:
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def _post(client: httpx.Client, path: str, token: str, body: bytes) -> httpx.Response:
    return client.post(path, content=body, headers={"Authorization": f"Bearer {token}",
                                                    "content-type": "application/json"})


def _assert_refused_and_still_serving(client: httpx.Client, response: httpx.Response) -> None:
    """422 with the JSON error body, and the next request travels on the same connection
    (a closed one would fail or come from another local port)."""
    port = _local_port(response)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["status"] == 422
    assert "Traceback" not in response.text
    health = client.get("/healthz")
    assert health.status_code == 200
    assert _local_port(health) == port, "the connection was dropped"


@pytest.mark.parametrize("probe", PROBES, ids=[p.entry for p in PROBES])
def test_lone_surrogate_is_refused_with_422(probe: Probe, tokens, connection) -> None:
    token = tokens[probe.role]
    # json.dumps writes the surrogate as the escape \ud800: valid JSON, invalid text.
    response = _post(connection, probe.path, token, json.dumps(probe.body(probe.lone)).encode())
    _assert_refused_and_still_serving(connection, response)
    print(f"{probe.entry}: 422 {response.json()['error']['message']}")

    control = _post(connection, probe.path, token, json.dumps(probe.body(probe.valid)).encode())
    assert control.status_code in (200, 201), control.text


def test_raw_surrogate_bytes_are_refused(tokens, connection) -> None:
    """ED A0 80 is the surrogate written as if it were UTF-8; Python's JSON reader decodes
    it into U+D800 instead of refusing the body."""
    name = _unique("surrogate-raw")
    raw = b'{"name": "%s\xed\xa0\x80", "role": "root"}' % name.encode()
    response = _post(connection, "/v1/admin/identities", tokens["admin"], raw)
    _assert_refused_and_still_serving(connection, response)
    control = _post(connection, "/v1/admin/identities", tokens["admin"],
                    raw.replace(b"\xed\xa0\x80", b""))
    assert control.status_code == 201, control.text


def test_body_that_is_not_utf8_is_a_422(tokens, connection) -> None:
    """Not UTF-8 at all (FastAPI's own answer would be an undocumented 400)."""
    response = _post(connection, "/v1/admin/identities", tokens["admin"],
                     b'{"name": "\xff", "role": "root"}')
    _assert_refused_and_still_serving(connection, response)


@pytest.mark.parametrize("allow", [f'symbol = "{LONE_ESCAPE}"'.encode(),
                                   b'symbol = "\xed\xa0\x80"'],
                         ids=["escape", "raw-bytes"])
def test_allow_option_with_a_lone_surrogate_fails_in_one_line(keyserver, allow: bytes) -> None:
    """``identity add --allow`` through the CLI, as an escape in the predicate and as raw
    bytes that are not UTF-8 (Python hands those over as lone surrogates): a one-line
    error from the server's 422 and a non-zero exit, never a traceback."""
    done = subprocess.run(
        [*map(str.encode, cli_command("identity", "add", "--server", keyserver.base_url,
                                      "--admin-token", keyserver.admin_token, "--name",
                                      _unique("surrogate-cli"), "--role", "subscriber",
                                      "--allow")), allow],
        env=child_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "422" in lines[0] and "surrogate" in lines[0], done.stderr


def test_control_characters_refused_on_postgresql(keyserver_factory, postgres_url) -> None:
    """NUL in a stored string made PostgreSQL raise (500 before the shared text check);
    the same probes are now 422, and the server keeps serving."""
    url = fresh_database(postgres_url)
    server = keyserver_factory.start(init_args=("--database-url", url),
                                     serve_args=("--database-url", url, "--workers", "1"))
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        subscriber = _post(client, "/v1/admin/identities", server.admin_token, json.dumps(
            {"name": "nul-subscriber", "role": "subscriber"}).encode()).json()["token"]
        for token, path, body in (
                (server.admin_token, "/v1/admin/bulk", _bulk(chunk="\x00")),
                (subscriber, "/v1/directory", {"address": "peer\x00.example:4000",
                                               "attribute": "symbol", "role": "subscriber",
                                               "ttl": 60})):
            response = _post(client, path, token, json.dumps(body).encode())
            _assert_refused_and_still_serving(client, response)
            assert "control character" in response.text
        # control: NUL as a predicate value is fine (it is stored escaped, as \u0000)
        enrolled = _post(client, "/v1/enrol/subscriber", subscriber,
                         json.dumps({"subscription": 'symbol = "\\u0000"'}).encode())
        assert enrolled.status_code == 200, enrolled.text
