"""Fuzzing the key server from its own OpenAPI spec (schemathesis): no 5xx anywhere, and every
error has the one JSON error shape. Deterministic (derandomized Hypothesis)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from keyserver.client import KeyServerClient

EXAMPLES_PER_OPERATION = 25


def _token_for(path: str, tokens: dict[str, str]) -> str:
    for role in ("subscriber", "publisher", "root"):
        if path.endswith("/" + role):
            return tokens[role]
    return tokens["admin"] if path.startswith("/v1/admin") else tokens["subscriber"]


def test_no_server_errors_anywhere(keyserver):
    admin = KeyServerClient(keyserver.base_url, keyserver.admin_token)
    tokens = {role: admin.create_identity(f"fuzz-{role}", role)["token"]
              for role in ("subscriber", "publisher", "root")} | {"admin": keyserver.admin_token}
    api = schemathesis.openapi.from_url(keyserver.base_url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 15

    for operation in operations:
        _fuzz(operation, keyserver.base_url, _token_for(operation.path, tokens))


def _fuzz(operation, base_url: str, token: str) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck), database=None)
    def fuzz(case) -> None:
        response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code < 500, (case.method, case.path, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["status"] == response.status_code and error["message"]

    fuzz()
