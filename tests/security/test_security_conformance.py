"""The key server against its own OpenAPI document (schemathesis), and its last-resort
error handler.

Fuzzing: every operation gets schema-valid and schema-invalid requests (derandomized, so
each run sends the same ones) and every answer must pass schemathesis's checks: no 5xx,
every status documented, the documented content type, a body matching the documented
schema (the one error shape for every error), auth enforced. Controls show that the checks
bite: real answers validated against an operation that does not document them fail.

The last-resort handler: an unhandled exception must become the JSON 500 without a
traceback, on a connection that stays open for the next request.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from hypothesis import HealthCheck, given, settings
from keyserver_fixtures import KeyServer, KeyServers
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ibe_pubsub.evaluation.launcher import free_port
from ibe_pubsub.keyserver.errors import error_response, install_error_handlers

EXAMPLES = 30  # per operation and generation mode
TIME_LIMIT = 90.0
# Every built-in check runs but one: schema-valid is not always acceptable, as predicates,
# attribute names and credential labels follow the key store's schema, which JSON Schema
# cannot say (such bodies get a documented 422). Invalid data must get one of this
# server's documented refusals (413 included: a generated body can be too large).
CONFIG = schemathesis.Config.from_dict({"checks": {
    "positive_data_acceptance": {"enabled": False},
    "negative_data_rejection": {"expected-statuses": [401, 403, 404, 409, 413, 422, 429]}}})
CONFORMANCE = [status_code_conformance, content_type_conformance, response_schema_conformance,
               response_headers_conformance]
LIMIT = 64 * 1024  # bodies above it are refused on every route of the fuzzed server
PATH_PARAMETERS = {"identity_id": 1, "attribute": "symbol", "address": "127.0.0.1:9"}
UNLIMITED = ("--rate", "1e6", "--burst", "1000000", "--address-rate", "1e6",
             "--address-burst", "1000000")


def _tokens(server: KeyServer, prefix: str) -> dict[str, str]:
    """The admin token and a fresh identity's token per role."""
    with httpx.Client(base_url=server.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {server.admin_token}"}) as admin:
        return {role: admin.post("/v1/admin/identities",
                                 json={"name": f"{prefix}-{role}", "role": role}
                                 ).json()["token"]
                for role in ("subscriber", "publisher", "root")} | {"admin": server.admin_token}


def _token_for(path: str, tokens: dict[str, str]) -> str:
    for role in ("subscriber", "publisher", "root"):
        if path.endswith("/" + role):
            return tokens[role]
    return tokens["admin"] if path.startswith("/v1/admin") else tokens["subscriber"]


def _error_shape(_: Any, response: Any, case: Any) -> None:
    """Beyond the schema: the error names its own status and never carries a traceback."""
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        assert response.json()["error"]["status"] == response.status_code


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyServer]:
    """A server of its own (the fuzzer revokes identities by guessed id), for this module."""
    servers = KeyServers(tmp_path_factory.mktemp("conformance"))
    try:
        # rate limits out of reach: checks that expect a 401 must not meet a 429
        yield servers.start(serve_args=("--workers", "1", "--bulk-max-body", str(LIMIT),
                                        *UNLIMITED))
    finally:
        servers.stop_all()


@pytest.fixture(scope="module")
def api(fuzzed) -> Any:
    return schemathesis.openapi.from_url(fuzzed.base_url + "/openapi.json", config=CONFIG)


def test_every_answer_conforms_to_the_openapi(fuzzed: KeyServer, api: Any) -> None:
    tokens = _tokens(fuzzed, "fuzz")
    # revocation last, so that it cannot take the fuzzing identities away from the others
    operations = sorted((result.ok() for result in api.get_all_operations()),
                        key=lambda op: op.path.endswith("/revoke"))
    assert len(operations) >= 16

    failures: collections.Counter[str] = collections.Counter()
    statuses: collections.Counter[int] = collections.Counter()
    start = time.monotonic()
    with requests.Session() as session:
        for operation in operations:
            token = _token_for(operation.path, tokens)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and not _has_inputs(operation):
                    continue  # nothing to get wrong
                _fuzz(operation, mode, lambda case, t=token: _call(
                    case, fuzzed.base_url, session, t, statuses, failures))
    elapsed = time.monotonic() - start
    print(f"schemathesis: {sum(statuses.values())} requests in {elapsed:.1f} s, "
          f"statuses {dict(sorted(statuses.items()))}, failures {dict(failures)}")
    assert not failures
    assert {200, 201, 401, 404, 409, 422} <= set(statuses), "the fuzzing reached too little"
    assert elapsed < TIME_LIMIT


def _has_inputs(operation: Any) -> bool:
    return any(True for _ in operation.iter_parameters()) or bool(operation.body)


def _fuzz(operation: Any, mode: GenerationMode, call: Callable[[Any], None]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case: Any) -> None:
        call(case)

    fuzz()


def _call(case: Any, base_url: str, session: requests.Session, token: str,
          statuses: collections.Counter[int], failures: collections.Counter[str]) -> None:
    """Send one case and run every check on the answer; failures are counted, not raised,
    so that one run reports all of them. A generated bearer token is made up: it is
    replaced by a real one; a case without one (a negative case testing auth) stays so."""
    sent = {name.lower() for name in case.headers or {}}
    headers = {"Authorization": f"Bearer {token}"} if "authorization" in sent else None
    try:
        response = case.call_and_validate(base_url=base_url, session=session, headers=headers,
                                          additional_checks=[_error_shape])
        statuses[response.status_code] += 1
    except FailureGroup as group:
        for failure in group.exceptions:
            failures[f"{case.operation.label}: {failure.title}"] += 1


def _validate(api: Any, path: str, response: requests.Response, check: Any) -> None:
    api[path]["GET"].Case().validate_response(response, checks=[check])


@pytest.mark.parametrize(("path", "answered_by", "check"), [
    # a 401 is undocumented for a public route
    ("/v1/params", "/v1/admin/identities", status_code_conformance),
    # text/plain is undocumented for the epoch
    ("/v1/epoch", "/metrics", content_type_conformance),
    # the epoch's answer does not have the parameters' fields
    ("/v1/params", "/v1/epoch", response_schema_conformance),
])
def test_controls_the_checks_catch_a_wrong_answer(fuzzed: KeyServer, api: Any, path: str,
                                                  answered_by: str, check: Any) -> None:
    """The checks above are not vacuous: the route's own answer passes, a real answer from
    another route fails."""
    _validate(api, path, requests.get(fuzzed.base_url + path, timeout=60), check)
    with pytest.raises(FailureGroup):
        _validate(api, path, requests.get(fuzzed.base_url + answered_by, timeout=60), check)


def _operations(api: Any) -> list[Any]:
    return [result.ok() for result in api.get_all_operations()]


def _send_to_each(api: Any, base_url: str, tokens: dict[str, str], body: bytes | None
                  ) -> Iterator[tuple[Any, requests.Response]]:
    """One real request to every operation, each answer with the operation it was for."""
    with requests.Session() as session:
        for operation in _operations(api):
            token = _token_for(operation.path, tokens)
            response = session.request(
                operation.method.upper(), base_url + operation.path.format(**PATH_PARAMETERS),
                data=body, timeout=60, headers={"Authorization": f"Bearer {token}",
                                                "content-type": "application/json"})
            yield operation, response


def test_413_of_every_route_conforms(fuzzed: KeyServer, api: Any) -> None:
    """The fuzzing never sends too much; the body limit's answer is documented everywhere."""
    for operation, response in _send_to_each(api, fuzzed.base_url, _tokens(fuzzed, "limit"),
                                             b" " * (LIMIT + 1)):
        assert response.status_code == 413, (operation.label, response.text)
        operation.Case().validate_response(response, checks=CONFORMANCE)


def test_429_of_every_route_conforms(api: Any, tmp_path: Path) -> None:
    """The same for the rate limit's answer, from a server whose client address has used
    up its single request (its readiness check); same app, so the fuzzed one's document."""
    servers = KeyServers(tmp_path)
    try:
        limited = servers.start(serve_args=("--workers", "1", "--address-burst", "1",
                                            "--address-rate", "0.001"))
        tokens = dict.fromkeys(("subscriber", "publisher", "root", "admin"),
                               limited.admin_token)  # refused before the token counts
        for operation, response in _send_to_each(api, limited.base_url, tokens, None):
            assert response.status_code == 429, (operation.label, response.text)
            assert int(response.headers["Retry-After"]) >= 1
            operation.Case().validate_response(response, checks=CONFORMANCE)
    finally:
        servers.stop_all()


@pytest.mark.parametrize("fine_depth", ["1", 1.0, True])
def test_coerced_values_are_refused(fuzzed: KeyServer, fine_depth: Any) -> None:
    """What the document calls an integer must be one (the fuzzer's negative cases rely
    on it); the control with a real integer is issued."""
    token = _tokens(fuzzed, f"strict-{type(fine_depth).__name__}")["subscriber"]
    with httpx.Client(base_url=fuzzed.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        refused = client.post("/v1/enrol/subscriber",
                              json={"subscription": "", "fine_depth": fine_depth})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["detail"][0]["loc"] == ["body", "fine_depth"]
        control = client.post("/v1/enrol/subscriber", json={"subscription": "", "fine_depth": 1})
        assert control.status_code == 200, control.text


# -- the last-resort handler ----------------------------------------------------------------

def _crashing_app(install: Callable[[FastAPI], None]) -> FastAPI:
    app = FastAPI()
    install(app)

    @app.get("/crash")
    def crash() -> None:
        raise RuntimeError("secret internal state")

    @app.get("/ok")
    def ok() -> dict[str, bool]:
        return {"ok": True}

    return app


def _old_catch_all(app: FastAPI) -> None:
    """The catch-all this server had before: an ``Exception`` handler, which Starlette calls
    and then re-raises."""
    @app.exception_handler(Exception)
    async def crash(_: Request, __: Exception) -> JSONResponse:
        return error_response(500, "internal error")


@pytest.fixture
def serve() -> Iterator[Callable[[FastAPI], str]]:
    """Serve an app with uvicorn in a thread of this process; yields its base URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: FastAPI) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="critical"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass(frozen=True)
class CrashThenOk:
    """The 500, then what the same keep-alive client got next, each with its local port."""

    crashed: httpx.Response
    crashed_port: int
    after: httpx.Response | httpx.TransportError
    after_port: int | None


def _crash_then_ok(base_url: str) -> CrashThenOk:
    ports: list[int] = []  # local port of each answer, taken as soon as its headers arrive

    def port(response: httpx.Response) -> None:
        ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])

    with httpx.Client(base_url=base_url, timeout=30, event_hooks={"response": [port]}) as client:
        crashed = client.get("/crash")
        try:
            after = client.get("/ok")
        except httpx.TransportError as exc:
            return CrashThenOk(crashed, ports[0], exc, None)
        return CrashThenOk(crashed, ports[0], after, ports[1])


def test_unhandled_error_is_json_500_and_connection_survives(serve) -> None:
    seen = _crash_then_ok(serve(_crashing_app(install_error_handlers)))
    assert seen.crashed.status_code == 500
    assert seen.crashed.json() == {"error": {
        "status": 500, "code": "internal_error",
        "message": "internal error (logged on the key server)"}}
    assert "secret" not in seen.crashed.text and "Traceback" not in seen.crashed.text
    assert isinstance(seen.after, httpx.Response) and seen.after.status_code == 200
    assert seen.after_port == seen.crashed_port, "the keep-alive connection was dropped"


def test_control_an_exception_handler_drops_the_connection(serve) -> None:
    """The same probe against the old handler: the next request on the connection fails,
    or (if the client saw the close in time) goes out on a new connection."""
    seen = _crash_then_ok(serve(_crashing_app(_old_catch_all)))
    assert seen.crashed.status_code == 500
    assert seen.after_port != seen.crashed_port
    print(f"old handler: next request got {type(seen.after).__name__}")
