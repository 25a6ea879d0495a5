"""Slow-loris against the key server, found by an attacker's review: a client opening
connections and never finishing a request head kept each one (h11 has no timeout for the
head, uvicorn's keep-alive timer stops at the first byte, nothing capped connections), and
the request gate never ran, since it sees complete heads only. About 1,050 of them (the
usual limit of 1,024 open files) and the server refused everyone, /healthz included.

Each server here starts with a soft limit of FD_LIMIT open files, and the attack opens more
connections than that, each sending a head without its final blank line. With the limits
(``keyserver/connections.py``): another address is served at once, connections beyond the
per-address or total cap get a 503 and are closed, and the slow ones are closed at the head
timeout, however they trickle. The control turns the limits off (0) and shows the same
attack starving /healthz, so the test would catch the flaw.

Over TLS, asyncio hands a connection to the HTTP protocol only once its handshake is over,
so connections that never sent (or never finished) a ClientHello escaped the limits and
held their files for asyncio's 60 s handshake timeout. The TLS tests repeat the attack
with such connections against a server serving HTTPS, and its control.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from keyserver_fixtures import PASSPHRASE, KeyServer, KeyServers
from tls_certificates import self_signed

from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
)
from ibe_pubsub.keyserver import ServerSettingsError
from ibe_pubsub.keyserver.announcing import AnnouncingServer, gated_protocol
from ibe_pubsub.keyserver.connections import (
    FD_RESERVE,
    ConnectionGate,
    ConnectionLimits,
    address_key,
)
from ibe_pubsub.keyserver.server import check_tls_files

pytestmark = pytest.mark.serial
FD_LIMIT = 256
ATTACK = FD_LIMIT + 44  # connections, more than the server may have files
HEAD_TIMEOUT = 2.0  # seconds, --header-timeout of the guarded server
PER_ADDRESS = 64  # the default --max-connections-per-address
TOTAL = FD_LIMIT - FD_RESERVE  # the cap derived from FD_LIMIT
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # no blank line: never complete
OTHER = "127.0.0.2"  # the client that must still be served; every address is loopback
SLACK = 1.5  # seconds a shared machine may add to a deadline


@contextmanager
def open_files(limit: int) -> Iterator[None]:
    """This process's soft limit of open files lowered to ``limit`` (the servers it starts
    inherit it), then restored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _start(servers: KeyServers, *serve_args: str) -> KeyServer:
    with open_files(FD_LIMIT):
        return servers.start(serve_args=("--workers", "1", *serve_args))


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KeyServer, int]]:
    """A server with the default caps and a short head timeout; with its process id."""
    servers = KeyServers(tmp_path_factory.mktemp("guarded"))
    try:
        server = _start(servers, "--header-timeout", str(HEAD_TIMEOUT))
        yield server, servers.processes[server.base_url].pid
    finally:
        servers.stop_all()


def _port(server: KeyServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def _slow_heads(stack: ExitStack, port: int, count: int, source: str) -> list[socket.socket]:
    """``count`` connections from ``source``, each sending an unfinished head; closed with
    ``stack``."""
    socks = []
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5,
                                                            source_address=(source, 0)))
        sock.sendall(SLOW_HEAD)
        socks.append(sock)
    return socks


def _answer_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock`` (b"" if nothing or reset), or None if it
    is still open after ``seconds``."""
    sock.settimeout(max(seconds, 0.001))
    answer = b""
    try:
        while chunk := sock.recv(4096):
            answer += chunk
    except TimeoutError:
        return None
    except OSError:
        pass
    return answer


def _assert_closed_at_the_head_timeout(held: list[socket.socket], started: float) -> None:
    """Every one of ``held`` (opened at ``started``) is closed unanswered, not before about
    the head timeout and not much after it."""
    closed = [_answer_within(sock, started + HEAD_TIMEOUT + SLACK - time.monotonic())
              for sock in held]
    assert closed == [b""] * PER_ADDRESS
    assert time.monotonic() - started >= HEAD_TIMEOUT * 0.9


def _still_open(socks: list[socket.socket], settle: float = 0.5) -> list[bool]:
    """After ``settle`` seconds, which of ``socks`` the server has neither answered nor
    closed (it sends nothing else to a connection without a complete head)."""
    time.sleep(settle)
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        ready = {key.fileobj for key, _ in selector.select(timeout=0)}
    return [sock not in ready for sock in socks]


def _health(server: KeyServer, source: str, timeout: float = 5.0,
            verify: ssl.SSLContext | bool = True) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source, verify=verify)
    with httpx.Client(transport=transport, timeout=timeout) as client:
        return client.get(server.base_url + "/healthz")


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_slow_heads_beyond_the_file_limit_leave_another_address_served(guarded):
    server, pid = guarded
    baseline = _open_fds(pid)
    with ExitStack() as stack:
        started = time.monotonic()
        attack = _slow_heads(stack, _port(server), ATTACK, "127.0.0.1")
        held, surplus = attack[:PER_ADDRESS], attack[PER_ADDRESS:]
        # Beyond the per-address cap: refused at once, a 503 when it arrives before the reset.
        assert _still_open(attack) == [True] * PER_ADDRESS + [False] * len(surplus)
        answers = [_answer_within(sock, 0.0) for sock in surplus]
        assert any(b'"too_many_connections"' in a for a in answers if a.startswith(b"HTTP/1.1 503"))
        assert _open_fds(pid) <= baseline + PER_ADDRESS + 4
        # Another address is served while the held ones wait for their heads.
        asked = time.monotonic()
        assert _health(server, OTHER).status_code == 200
        assert time.monotonic() - asked < 1.0
        assert _answer_within(held[0], 0.0) is None
        # The held connections are closed at the head timeout, none of them answered.
        _assert_closed_at_the_head_timeout(held, started)
    assert _health(server, "127.0.0.1").status_code == 200  # the address's count is released


def test_a_trickled_head_and_an_idle_keep_alive_are_closed_at_the_head_timeout(guarded):
    server, _ = guarded
    with ExitStack() as stack:
        trickle = _slow_heads(stack, _port(server), 1, "127.0.0.3")[0]
        kept = stack.enter_context(socket.create_connection(("127.0.0.1", _port(server)),
                                                            source_address=("127.0.0.4", 0)))
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next head, begun and left
        # A byte every 0.3 s on both: uvicorn's keep-alive timer stopped at the first byte
        # and nothing else bounded them; the head timer counts on from its start.
        while time.monotonic() - answered < HEAD_TIMEOUT + SLACK:
            try:
                trickle.sendall(b"X")
                kept.sendall(b"X")
            except OSError:
                break
            time.sleep(0.3)
        assert _answer_within(trickle, 0.5) == b""
        rest = _answer_within(kept, 0.5)  # of the first answer, if recv took only its head
        assert rest is not None and b"HTTP/1.1" not in rest
        assert time.monotonic() - answered < HEAD_TIMEOUT + SLACK + 1.0


def test_the_total_cap_refuses_what_many_addresses_open_beyond_it(guarded):
    server, pid = guarded
    # Each address under its cap, all of them together beyond the file limit.
    sources = [f"127.0.0.{10 + i}" for i in range(-(-ATTACK // PER_ADDRESS))]
    with ExitStack() as stack:
        started = time.monotonic()
        attack = [sock for source in sources
                  for sock in _slow_heads(stack, _port(server), PER_ADDRESS, source)]
        assert len(attack) > FD_LIMIT
        assert sum(_still_open(attack)) == TOTAL
        assert _open_fds(pid) < FD_LIMIT - FD_RESERVE // 2
        # Full: another address gets a prompt 503, not a hang, until the timeout frees room.
        refused = _health(server, OTHER)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "too_many_connections"
        deadline = started + HEAD_TIMEOUT + SLACK
        while (answer := _health(server, OTHER)).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert answer.status_code == 200


def test_control_without_the_limits_the_same_attack_starves_healthz(tmp_path):
    servers = KeyServers(tmp_path)
    try:
        server = _start(servers, "--header-timeout", "0", "--max-connections", "0",
                        "--max-connections-per-address", "0")
        assert _health(server, OTHER).status_code == 200
        with ExitStack() as stack:
            _slow_heads(stack, _port(server), ATTACK, "127.0.0.1")
            served = []
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                with suppress(httpx.TransportError):
                    served.append(_health(server, OTHER, timeout=1.0).status_code)
                time.sleep(0.1)
            assert 200 not in served
    finally:
        servers.stop_all()


# -- over TLS ----------------------------------------------------------------------------------

@contextmanager
def _tls_server(directory: Path, *serve_args: str
                ) -> Iterator[tuple[KeyServer, int, ssl.SSLContext]]:
    """A key server serving HTTPS (a self-signed certificate for 127.0.0.1) under the
    lowered file limit; with its process id and a client context trusting it."""
    cert, key = self_signed(directory)
    data = directory / "ks"
    init_keyserver(data, PASSPHRASE)
    port = free_port()
    with open_files(FD_LIMIT):
        process = start_keyserver(data, port, PASSPHRASE, ("--workers", "1", "--tls-cert", cert,
                                                           "--tls-key", key, *serve_args),
                                  log=directory / "server.log")
    try:
        server = KeyServer(f"https://127.0.0.1:{port}", "", data)
        trust = ssl.create_default_context(cafile=cert)
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (directory / "server.log").read_text()
            with suppress(httpx.TransportError):
                if _health(server, "127.0.0.1", 2.0, trust).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the TLS key server did not start"
            time.sleep(0.1)
        yield server, process.pid, trust
    finally:
        stop(process)


@pytest.fixture(scope="module")
def guarded_tls(tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[KeyServer, int, ssl.SSLContext]]:
    """A TLS server with the default caps and a short head timeout."""
    with _tls_server(tmp_path_factory.mktemp("guarded-tls"),
                     "--header-timeout", str(HEAD_TIMEOUT)) as served:
        yield served


def _client_hello() -> bytes:
    """A real TLS client's first flight, its ClientHello."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing,
                                                server_hostname="127.0.0.1")
    with suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _stalled_handshakes(stack: ExitStack, port: int, count: int) -> list[socket.socket]:
    """``count`` connections from 127.0.0.1 that never finish a TLS handshake: most send
    nothing, every fourth the first 100 bytes of a ClientHello; closed with ``stack``."""
    part = _client_hello()[:100]
    socks = []
    for i in range(count):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5,
                                                            source_address=("127.0.0.1", 0)))
        if i % 4 == 3:
            sock.sendall(part)
        socks.append(sock)
    return socks


def test_tls_handshakes_never_finished_are_capped_and_timed_out(guarded_tls):
    server, pid, trust = guarded_tls
    baseline = _open_fds(pid)
    with ExitStack() as stack:
        started = time.monotonic()
        attack = _stalled_handshakes(stack, _port(server), ATTACK)
        held, surplus = attack[:PER_ADDRESS], attack[PER_ADDRESS:]
        # Counted from their opening: beyond the per-address cap, closed at once, unanswered
        # (nothing can be said before a handshake).
        assert _still_open(attack) == [True] * PER_ADDRESS + [False] * len(surplus)
        assert {_answer_within(sock, 0.0) for sock in surplus} == {b""}
        assert _open_fds(pid) <= baseline + PER_ADDRESS + 4
        # Another address is served over HTTPS, several requests on one connection.
        asked = time.monotonic()
        transport = httpx.HTTPTransport(local_address=OTHER, verify=trust)
        with httpx.Client(transport=transport, timeout=5.0) as client:
            answers = [client.get(server.base_url + "/healthz") for _ in range(3)]
            connections = {a.extensions["network_stream"].get_extra_info("client_addr")
                           for a in answers}
        assert [a.status_code for a in answers] == [200] * 3
        assert len(connections) == 1
        assert time.monotonic() - asked < 1.0
        assert _answer_within(held[0], 0.0) is None
        # The stalled handshakes are closed at the head timeout.
        _assert_closed_at_the_head_timeout(held, started)
    assert _health(server, "127.0.0.1", verify=trust).status_code == 200  # count released


def test_a_tls_client_hello_waiting_when_the_server_accepts_is_not_lost(guarded_tls):
    """A busy server accepts a connection whose ClientHello has already arrived, and (with
    uvloop) reads it before the handshake begins: it must reach the handshake."""
    server, pid, trust = guarded_tls
    answer: list[int] = []
    asking = threading.Thread(target=lambda: answer.append(
        _health(server, "127.0.0.5", verify=trust).status_code))
    os.kill(pid, signal.SIGSTOP)
    try:
        asking.start()
        time.sleep(0.3)  # the TCP handshake completes in the kernel, the ClientHello waits
    finally:
        os.kill(pid, signal.SIGCONT)
    asking.join(10)
    assert answer == [200]


def _request_with_the_handshake_end(port: int, trust: ssl.SSLContext) -> bytes:
    """A TLS handshake done by hand whose last message (the client's Finished) goes in one
    write with a request, so the server decrypts the request as its handshake ends; the
    answer."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = trust.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for _ in range(20):
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(sock.recv(65536))
        tls.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        sock.sendall(outgoing.read())
        while not answer.endswith(b"https") and (chunk := sock.recv(65536)):
            incoming.write(chunk)
            with suppress(ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                while data := tls.read(65536):
                    answer += data
    return answer


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tls_is_done_by_the_gated_protocol_on_either_event_loop(tmp_path, loop):
    """In process, so that the app shows what uvicorn made of the connection: the scheme is
    https, and bytes arriving with the handshake reach the app, on both event loops."""
    async def scheme(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = scope["scheme"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    cert, key = self_signed(tmp_path)
    gate = ConnectionGate(ConnectionLimits(HEAD_TIMEOUT, 16))
    urls: list[str] = []
    server = AnnouncingServer(uvicorn.Config(
        scheme, host="127.0.0.1", port=0, loop=loop, lifespan="off", log_config=None,
        http=gated_protocol(gate, check_tls_files(cert, key)), ws="none"), urls.append, tls=True)
    serving = threading.Thread(target=server.run)
    serving.start()
    try:
        deadline = time.monotonic() + 10
        while not urls:
            assert serving.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        assert urls[0].startswith("https://")
        trust = ssl.create_default_context(cafile=cert)
        with httpx.Client(verify=trust, timeout=5.0) as client:
            assert [client.get(urls[0]).text for _ in range(3)] == ["https"] * 3
        port = int(urls[0].rsplit(":", 1)[1])
        assert _request_with_the_handshake_end(port, trust).endswith(b"\r\n\r\nhttps")
    finally:
        server.should_exit = True
        serving.join(15)
    assert gate.total == 0


def test_control_without_the_limits_stalled_tls_handshakes_starve_healthz(tmp_path):
    with ExitStack() as stack:
        server, _, trust = stack.enter_context(_tls_server(
            tmp_path, "--header-timeout", "0", "--max-connections", "0",
            "--max-connections-per-address", "0"))
        assert _health(server, OTHER, verify=trust).status_code == 200
        _stalled_handshakes(stack, _port(server), ATTACK)
        served = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            with suppress(httpx.TransportError):
                served.append(_health(server, OTHER, 1.0, trust).status_code)
            time.sleep(0.1)
        assert 200 not in served


def test_limits_are_derived_from_the_file_limit_and_checked_against_it():
    assert ConnectionLimits().resolved(1024).max_connections == 768
    assert ConnectionLimits().resolved(FD_LIMIT).max_connections == TOTAL
    assert ConnectionLimits().resolved(1 << 20).max_connections == 4096
    assert ConnectionLimits(max_connections=0).resolved(FD_LIMIT).max_connections == 0
    for limits, files in ((ConnectionLimits(max_connections=200), FD_LIMIT),
                          (ConnectionLimits(), FD_RESERVE)):
        with pytest.raises(ServerSettingsError, match="ulimit -n"):
            limits.resolved(files)
    for bad in ({"head_timeout": -1.0}, {"head_timeout": float("inf")},
                {"max_per_address": -1}):
        with pytest.raises(ServerSettingsError):
            ConnectionLimits(**bad)  # type: ignore[arg-type]
    assert address_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff") == "2001:db8::/64"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-connections", "100000000", "--max-connections 100000000 needs more open files"),
    ("--header-timeout", "-1", "--header-timeout: must not be negative"),
    ("--max-connections-per-address", "many", "expected an integer"),
])
def test_bad_limits_stop_serve_with_one_line(tmp_path, flag, value, message):
    done = subprocess.run(cli_command("keyserver", "serve", "--data", str(tmp_path / "none"),
                                      flag, value),
                          env=child_env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
