"""Public endpoints: parameters, schema, epoch, health, metrics (no token needed)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from ibe_pubsub.keyserver.api_models import EpochOut, Health, PublicParamsOut, SchemaOut
from ibe_pubsub.keyserver.auth import State
from ibe_pubsub.keyserver.enrolment import single_server_only
from ibe_pubsub.keyserver.errors import error_responses

router = APIRouter()


@router.get("/v1/params", response_model=PublicParamsOut, response_model_by_alias=True,
            tags=["public"], responses=error_responses())
def params(state: State) -> dict[str, Any]:
    """Master public key, signed schema, the server's Ed25519 key, the signed peer-link CA
    and the current epoch; 409 ``threshold_member`` on a member of a threshold deployment,
    whose clients take the deployment's key from /v3/threshold."""
    single_server_only(state, "parameters")
    e = state.epoch()
    return state.store.public_document() | state.store.peer_ca_document() | {
        "epoch": e.number, "epoch_start": e.start, "epoch_end": e.end,
        "epoch_length": e.length, "grace": e.grace}


@router.get("/v1/schema", response_model=SchemaOut, tags=["public"], responses=error_responses())
def schema(state: State) -> dict[str, Any]:
    """The schema, its id and the key server's signature (credentials.certificates)."""
    doc = state.store.public_document()
    return {k: doc[k] for k in ("schema", "schema_id", "schema_signature", "server_key")}


@router.get("/v1/epoch", response_model=EpochOut, tags=["public"], responses=error_responses())
def epoch(state: State) -> dict[str, Any]:
    now = time.time()
    e = state.epoch(now)
    return {"epoch": e.number, "epoch_start": e.start, "epoch_end": e.end,
            "epoch_length": e.length, "grace": e.grace, "in_grace": e.in_grace(now)}


@router.get("/healthz", response_model=Health, tags=["operations"], responses=error_responses())
def healthz(state: State) -> dict[str, Any]:
    return {"status": "ok", "epoch": state.epoch().number}


# A plain Response class: with PlainTextResponse the OpenAPI would list the JSON errors as text.
@router.get("/metrics", response_class=Response, tags=["operations"],
            responses={200: {"description": "Prometheus text format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}}
            | error_responses())
def metrics(state: State) -> PlainTextResponse:
    """Prometheus text format."""
    return PlainTextResponse(state.metrics.render())
