"""Key issuance, the CPU-bound pairing work, in a pool of worker processes.

The event loop only awaits; each worker process holds the public parameters, the
master secret and the server's signing key (handed over once, through the pool's
private pipe, at start) and returns keys already encoded as base64 text, so the
server process does no group arithmetic at all. One worker per core by default.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from credentials.backends import load_group
from credentials.codec import (
    decode_mpk,
    decode_msk,
    encode_mpk,
    encode_publisher_key,
    encode_request,
    encode_routing_token,
    encode_subscriber_key,
)
from credentials.credential import Credential
from credentials.keys import MasterSecretKey
from credentials.schema import Schema
from credentials.scheme import (
    PublicParams,
    build_connection_request,
    keygen_publisher,
    keygen_routing_token,
    keygen_subscriber,
)
from keyserver.keystore import KeyStore, b64


@dataclass(frozen=True)
class _Secrets:
    pp: PublicParams
    msk: MasterSecretKey
    signing_key: Ed25519PrivateKey


_worker: _Secrets | None = None


def _init_worker(mpk: bytes, msk: bytes, schema: dict[str, Any], signing_key: bytes) -> None:
    global _worker
    group = load_group()
    _worker = _Secrets(PublicParams(group, decode_mpk(group, mpk), Schema.from_dict(schema)),
                       decode_msk(group, msk), Ed25519PrivateKey.from_private_bytes(signing_key))


def _secrets() -> _Secrets:
    if _worker is None:
        raise RuntimeError("issuer worker was not initialised")
    return _worker


def _ready(_: int = 0) -> int:
    _secrets()
    return os.getpid()


def issue_subscriber(epoch: int, credentials: Sequence[Credential],
                     fine: Sequence[Credential], expires_at: int) -> dict[str, Any]:
    """D, S1/S2/T per credential, fine tokens, and one signed connection request per
    credential (expiring at ``expires_at``), encoded for the wire."""
    s = _secrets()
    key = keygen_subscriber(s.pp, s.msk, epoch, credentials, fine)
    requests = []
    for cred in credentials:
        request, sws = build_connection_request(s.pp, s.signing_key, cred, epoch, expires_at)
        requests.append({"attribute": cred.attribute, "credential": cred.label(),
                         "request": b64(encode_request(request)),
                         "secrets": [b64(sw) for sw in sws]})
    return {"subscriber_key": b64(encode_subscriber_key(key)), "connection_requests": requests}


def issue_publisher(epoch: int, credentials: Sequence[Credential]) -> dict[str, Any]:
    """One publisher key per credential, encoded for the wire."""
    s = _secrets()
    return {"publisher_keys": [b64(encode_publisher_key(keygen_publisher(s.pp, s.msk, c, epoch)))
                               for c in credentials]}


def issue_root_token(epoch: int, credential: Credential) -> str:
    """A root's token T of its attribute's whole-domain credential: it opens entry 0 of every
    connection request, which tells the root the requester's position."""
    s = _secrets()
    return b64(encode_routing_token(keygen_routing_token(s.pp, s.msk, credential, epoch)))


class IssuerPool:
    """Worker processes that issue keys; awaitable from the event loop."""

    def __init__(self, store: KeyStore, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        # spawn: no fork of a threaded server process; each worker imports afresh.
        self._executor = ProcessPoolExecutor(
            max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(encode_mpk(store.mpk), store.msk_bytes(), store.schema.to_dict(),
                      store.signing_key_bytes()))

    def warm_up(self) -> None:
        """Start every worker now rather than on the first enrolment."""
        list(self._executor.map(_ready, range(self.workers)))

    async def subscriber(self, epoch: int, credentials: Sequence[Credential],
                         fine: Sequence[Credential], expires_at: int) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, issue_subscriber, epoch,
                                          tuple(credentials), tuple(fine), expires_at)

    async def publisher(self, epoch: int, credentials: Sequence[Credential]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, issue_publisher, epoch,
                                          tuple(credentials))

    async def root_token(self, epoch: int, credential: Credential) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, issue_root_token, epoch, credential)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
