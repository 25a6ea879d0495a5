"""Key issuance, the CPU-bound pairing work, in a pool of worker processes.

The event loop only awaits; each worker process holds the public parameters, the
master secret and the server's signing key (handed over once, through the pool's
private pipe, at start) and returns keys already encoded as base64 text, so the
server process does no group arithmetic at all. One worker per core by default. The
workers of a threshold deployment's member hold its shares instead, and no master secret.

Because the workers hold the master secret they must not outlive the server: a server
killed with SIGKILL cannot shut its pool down, and the pool's pipes do not close while the
workers hold both ends, so each worker watches its parent and exits when it is gone.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    G2,
    Credential,
    MasterSecretKey,
    PublicParams,
    Schema,
    ServerSecrets,
    ThresholdPublicKey,
    build_connection_request,
    decode_mpk,
    decode_msk,
    encode_mpk,
    encode_publisher_key,
    encode_request,
    encode_routing_token,
    encode_subscriber_key,
    keygen_publisher,
    keygen_routing_token,
    keygen_subscriber,
    load_group,
    root_certificate_message,
)
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver.exceptions import KeyServerError
from ibe_pubsub.keyserver.keystore import KeyStore, b64
from ibe_pubsub.keyserver.threshold_store import ThresholdMember


@dataclass(frozen=True)
class _Secrets:
    pp: PublicParams
    msk: MasterSecretKey
    signing_key: Ed25519PrivateKey


@dataclass(frozen=True)
class _MemberSecrets:
    pp: PublicParams
    tpk: ThresholdPublicKey
    shares: ServerSecrets


_worker: _Secrets | None = None
_member: _MemberSecrets | None = None
PARENT_POLL_SECONDS = 0.5


def _exit_with_parent(parent_pid: int) -> None:
    """Poll the parent pid; an orphan is re-parented, so a change means the server died.
    (Portable, unlike a parent-death signal, which Linux ties to the spawning thread.)"""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def _start_worker(parent_pid: int) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the server shuts its pool down
    # then, and a worker that took the signal itself would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="parent-watch",
                     daemon=True).start()


def _init_worker(parent_pid: int, mpk: bytes, msk: bytes, schema: dict[str, Any],
                 signing_key: bytes) -> None:
    global _worker
    _start_worker(parent_pid)
    group = load_group()
    _worker = _Secrets(PublicParams(group, decode_mpk(group, mpk), Schema.from_dict(schema)),
                       decode_msk(group, msk), Ed25519PrivateKey.from_private_bytes(signing_key))


def _init_member_worker(parent_pid: int, public_key: bytes, shares: ServerSecrets,
                        schema: dict[str, Any]) -> None:
    global _member
    _start_worker(parent_pid)
    group = load_group()
    tpk = T.decode_public_key(group, public_key)
    _member = _MemberSecrets(PublicParams(group, tpk.mpk, Schema.from_dict(schema)), tpk,
                             shares)


def _secrets() -> _Secrets:
    if _worker is None:
        raise KeyServerError("issuer worker was not initialised")
    return _worker


def _member_secrets() -> _MemberSecrets:
    if _member is None:
        raise KeyServerError("issuer worker was not initialised as a threshold member")
    return _member


def _ready(_: int = 0) -> int:
    if _member is None:
        _secrets()
    return os.getpid()


def issue_subscriber_key(epoch: int, credentials: Sequence[Credential],
                         fine: Sequence[Credential]) -> str:
    """D, S1/S2/T per credential and the fine tokens, encoded for the wire: the cheap part
    of a subscriber's issuance, bound together by one gamma_s, so issued in one piece."""
    s = _secrets()
    return b64(encode_subscriber_key(keygen_subscriber(s.pp, s.msk, epoch, credentials, fine)))


def issue_connection_requests(epoch: int, credentials: Sequence[Credential],
                              expires_at: int) -> list[dict[str, Any]]:
    """One signed connection request per credential (expiring at ``expires_at``): most of a
    subscriber's issuance, independent per credential, so it can be issued in chunks."""
    s = _secrets()
    requests = []
    for cred in credentials:
        request, sws = build_connection_request(s.pp, s.signing_key, cred, epoch, expires_at)
        requests.append({"attribute": cred.attribute, "credential": cred.label(),
                         "request": b64(encode_request(request)),
                         "secrets": [b64(sw) for sw in sws]})
    return requests


def issue_subscriber(epoch: int, credentials: Sequence[Credential],
                     fine: Sequence[Credential], expires_at: int) -> dict[str, Any]:
    """A whole subscriber bundle's keys in one call (the benchmark's floor)."""
    return {"subscriber_key": issue_subscriber_key(epoch, credentials, fine),
            "connection_requests": issue_connection_requests(epoch, credentials, expires_at)}


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


def issue_subscriber_share(identity: str, epoch: int, credentials: Sequence[Credential],
                           fine: Sequence[Credential]) -> str:
    """This member's share of a subscriber's keys (``keyshare_subscriber``), encoded."""
    m = _member_secrets()
    return b64(T.encode_subscriber_share(T.keyshare_subscriber(
        m.pp, m.tpk, m.shares, identity, epoch, credentials, fine)))


def issue_request_signatures(identity: str, epoch: int, credentials: Sequence[Credential],
                             expires_at: int, seed: bytes, binding: bytes
                             ) -> list[dict[str, str]]:
    """Each credential's connection request, derived from the requester's ``seed`` and
    bound to its ``V`` (``binding``, a G2 point the web process checked): its body and this
    member's partial signature of it, encoded."""
    m = _member_secrets()
    V = m.pp.group.deserialize(G2, binding)
    out = []
    for c in credentials:
        body, partial = T.partial_sign_request(m.pp, m.shares, identity, c, epoch, expires_at,
                                               seed, V)
        out.append({"attribute": c.attribute, "credential": c.label(), "request": b64(body),
                    "signature": b64(T.encode_partial_signature(partial))})
    return out


def issue_root_shares(identity: str, epoch: int, credential: Credential,
                      transport_key: bytes, expires_at: int) -> dict[str, str]:
    """This member's partial signature of a root's certificate (the message version 2's
    server signs with Ed25519) and its share of the root's whole-domain token, encoded."""
    m = _member_secrets()
    message = root_certificate_message(credential.attribute, transport_key, epoch, expires_at)
    return {"certificate": b64(T.encode_partial_signature(T.partial_sign(
                m.pp.group, m.shares, message))),
            "routing_token": b64(T.encode_token_share(T.keyshare_token(
                m.pp, m.tpk, m.shares, identity, epoch, credential)))}


def issue_publisher_shares(identity: str, epoch: int, credentials: Sequence[Credential]
                           ) -> list[str]:
    """This member's share of one publisher key per credential, encoded."""
    m = _member_secrets()
    return [b64(T.encode_publisher_share(T.keyshare_publisher(
        m.pp, m.tpk, m.shares, identity, c, epoch))) for c in credentials]


Job = TypeVar("Job")


class IssuerPool:
    """Worker processes that issue keys; awaitable from the event loop. Given a threshold
    ``member``, they hold its shares and never the key store's master secret."""

    def __init__(self, store: KeyStore, workers: int | None = None,
                 member: ThresholdMember | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        initializer: Callable[..., None]
        if member is None:
            initializer = _init_worker
            initargs: tuple[Any, ...] = (os.getpid(), encode_mpk(store.mpk), store.msk_bytes(),
                                         store.schema.to_dict(), store.signing_key_bytes())
        else:
            initializer = _init_member_worker
            initargs = (os.getpid(), T.encode_public_key(member.public_key), member.secrets,
                        store.schema.to_dict())
        # spawn: no fork of a threaded server process; each worker imports afresh.
        self._executor = ProcessPoolExecutor(
            max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=initializer, initargs=initargs)

    def warm_up(self) -> None:
        """Start every worker now rather than on the first enrolment. They start with SIGINT
        blocked (the mask survives exec) until they ignore it: a Ctrl-C to the terminal's
        process group while one is still importing would otherwise end it in a traceback."""
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            list(self._executor.map(_ready, range(self.workers)))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def submit(self, job: Callable[..., Job], *args: Any) -> asyncio.Future[Job]:
        """Run ``job(*args)`` in a worker. The server submits through
        ``keyserver.fair_pool.FairIssuer``, which keeps at most one job per worker here."""
        return asyncio.get_running_loop().run_in_executor(self._executor, job, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
