"""Restarting a peer with the default ``--listen 127.0.0.1:0``: it takes the address its
identity already holds, so restarts neither use up the cap of certified addresses nor leave
a dead address of their own in the directory to slow the next join; and a port the system
picks that a stopped peer of another identity still holds is given up for another."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
from keyserver_fixtures import PASSPHRASE

from ibe_pubsub.evaluation import netns
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.launcher import free_port, start_keyserver, wait_ready
from ibe_pubsub.keyserver.client import KeyServerClient


def test_restarts_on_the_default_listen_reuse_the_held_address(keyserver_factory, tmp_path):
    """With a cap of 2 addresses, the third start on a new random port was refused (409
    ``too_many_addresses``); now every start takes the one address the identity holds."""
    server = keyserver_factory.start(serve_args=("--max-peer-addresses", "2"))
    cluster = Cluster(server.base_url, server.admin_token, tmp_path)
    token = cluster.identity("restarted", "root")
    stranger_token = cluster.identity("stranger", "root")
    addresses = []
    try:
        for start in range(4):
            root = cluster.start_root(f"root-{start}", ["symbol"], token=token)
            cluster.wait_ready([root], timeout=30)
            addresses.append(root.address)
            root.process.terminate()
            assert root.process.wait(10) == 0
    finally:
        cluster.stop_all()
    print(f"addresses of four starts: {addresses}")
    assert len(set(addresses)) == 1
    with KeyServerClient(server.base_url, token) as own:
        assert [a["address"] for a in own.held_addresses()] == addresses[:1]
    # the list is the caller's own: another identity's token, or none, reads nothing of it
    with KeyServerClient(server.base_url, stranger_token) as stranger:
        assert stranger.held_addresses() == []
    anonymous = httpx.get(server.base_url + "/v1/enrol/transport")
    assert anonymous.status_code == 401 and addresses[0] not in anonymous.text
    with KeyServerClient(server.base_url, server.admin_token) as admin:
        assert admin.lookup("symbol")["roots"] == []  # each stop left the directory


NO_NAMESPACE = netns.unavailable(("ip",))


@pytest.mark.skipif(NO_NAMESPACE is not None, reason=str(NO_NAMESPACE))
def test_a_picked_port_another_identity_holds_is_given_up_for_another(keyserver_factory,
                                                                       tmp_path):
    """A peer on the default ``--listen 127.0.0.1:0`` whose port, picked by the system, is
    one a stopped peer of another identity had (its certificate lives until it expires)
    exited, refused (409 ``address_taken``); now it listens on another port the system
    picks. In a namespace whose ephemeral ports are 40000-40099, Linux gives a listener on
    port 0 an odd port of the lower half first: the test holds all of them but 40001 on
    127.0.0.1, and 40001 on 127.0.0.2 (so that no outgoing connection takes it: those skip
    ports bound on any address), which leaves 40001 the first pick (checked first)."""
    with netns.loopback_host((40000, 40099)), contextlib.ExitStack() as guards:
        for host, port in [("127.0.0.2", 40001),
                           *(("127.0.0.1", port) for port in range(40003, 40050, 2))]:
            guard = guards.enter_context(socket.socket())
            guard.bind((host, port))
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first != 40001:
            pytest.skip(f"this kernel picks port {first} first, not 40001: the test cannot "
                        "make the peer pick the held port")
        server = keyserver_factory.start(port=8000)  # outside the ephemeral ports
        cluster = Cluster(server.base_url, server.admin_token, tmp_path)
        try:
            holder = cluster.start_root("holder", ["symbol"], listen="127.0.0.1:40001")
            cluster.wait_ready([holder])
            holder.process.terminate()
            assert holder.process.wait(10) == 0
            picker = cluster.start_root("picker", ["symbol"])
            cluster.wait_ready([picker])
            with KeyServerClient(server.base_url, server.admin_token) as admin:
                roots = [e["address"] for e in admin.lookup("symbol")["roots"]]
            # 40001 is the first pick again: a subscriber moves too, then joins the root
            # that moved (both overlays run on the addresses they are certified for)
            joiner = cluster.start_subscriber("joiner", 'symbol = "IBM"')
            cluster.wait_ready([joiner])
            # a port the user chose is never changed: refused, the peer says so and exits
            fixed = cluster.start_root("fixed", ["symbol"], listen="127.0.0.1:40001")
            assert fixed.process.wait(30) != 0
        finally:
            cluster.stop_all()
    for peer in (picker, joiner):
        log = peer.log_file.read_text()
        print(f"{peer.name} listened on {peer.address}; its log:\n{log}")
        assert "127.0.0.1:40001 is certified to another identity" in log  # refused first
        assert f"listening on {peer.address} instead" in log
        assert peer.address != "127.0.0.1:40001"
    assert roots == [picker.address]
    refusal = fixed.log_file.read_text()
    assert "127.0.0.1:40001 is certified to another identity" in refusal, refusal
    assert "instead" not in refusal


def test_a_crashed_subscriber_restarts_without_waiting_on_its_own_dead_entry(
        keyserver_factory, tmp_path):
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path)
    root_token = cluster.identity("root", "root")
    try:
        root = cluster.start_root("root", ["symbol"], token=root_token)
        cluster.wait_ready([root])
        token = cluster.identity("crashing", "subscriber")
        first = cluster.start_subscriber("first", 'symbol = "IBM"', token=token)
        cluster.wait_ready([first])
        cluster.kill("first")  # SIGKILL: its entry stays listed
        # the root vouches for it, as at its next renewal (every 10 s): a newcomer would
        # dial the dead entry first
        with KeyServerClient(server.base_url, root_token) as vouching, \
                KeyServerClient(server.base_url, server.admin_token) as admin:
            for _ in range(20):  # on a busy machine its entry may be written a moment late
                vouching.register(root.address, "symbol", "root", 30, seen=[first.address])
                vouched = {e["address"] for e in admin.lookup("symbol")["members"]
                           if e["vouched"]}
                if first.address in vouched:
                    break
                time.sleep(0.25)
            assert first.address in vouched
        again = cluster.start_subscriber("again", 'symbol = "IBM"', token=token)
        cluster.wait_ready([again], timeout=30)
    finally:
        cluster.stop_all()
    joined = json.loads(again.ready_file.read_text())["join_seconds"]
    before = json.loads(first.ready_file.read_text())["join_seconds"]
    print(f"restarted at {again.address} (was {first.address}), joined in {joined:.2f} s "
          f"(its first start: {before:.2f} s)")
    assert again.address == first.address
    # Dialling its own dead entry first cost a 2 s join timeout (2.2 s in all, on a machine
    # where a join took 0.2 s): within 1.5 s of its first join, however slow the machine.
    assert joined < before + 1.5
    assert "gave up on" not in again.log_tail(100)


def test_a_peer_started_while_its_key_server_restarts_waits_for_it(keyserver_factory,
                                                                    tmp_path):
    """Found by the soak run: a subscriber restarted during the key server's own restart
    exited at once ("connection refused"). It now waits (``--server-wait``, 30 s by
    default) and starts once the server is back on its address. Control: with
    ``--server-wait 0`` the same start fails at once."""
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path)
    token = cluster.identity("patient", "root")
    port = int(server.base_url.rsplit(":", 1)[1])
    keyserver_factory.stop(server)
    try:
        impatient = cluster.start_root("impatient", ["symbol"], token=token,
                                       extra=("--server-wait", "0"))
        assert impatient.process.wait(30) == 2
        assert "connection refused" in impatient.log_tail()
        root = cluster.start_root("patient", ["symbol"], token=token)
        deadline = time.monotonic() + 30  # it says it waits, and stays (a restart)
        while "waiting for keys from the key server at" not in root.log_tail(50):
            assert root.process.poll() is None and time.monotonic() < deadline, \
                root.log_tail()
            time.sleep(0.2)
        time.sleep(1)
        assert root.process.poll() is None
        process = start_keyserver(server.data_dir, port, PASSPHRASE,
                                  log=server.data_dir / "server.log")
        keyserver_factory.processes[server.base_url] = process
        wait_ready(server.base_url, process)
        cluster.wait_ready([root], timeout=30)
        assert "waiting for keys from the key server at" in root.log_tail(50)
    finally:
        cluster.stop_all()


class _BlinkingRelay:
    """A TCP relay to the key server that forwards its first connection (a peer's first
    question: is the server up?), then refuses connections for ``dark`` seconds, as a key
    server does while it restarts, then forwards again."""

    def __init__(self, target: str, dark: float) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.target, self.dark = (host, int(port)), dark
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        port = self.listener.getsockname()[1]
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed at the end
                return
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
            if self.accepted == 1:
                self.listener.close()
                time.sleep(self.dark)
                self.listener = socket.create_server(("127.0.0.1", port))

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("listen_port, step", [(0, "its held address"), (None, "its keys")])
def test_a_key_server_going_down_while_a_peer_starts_is_waited_for(keyserver_factory,
                                                                   tmp_path, listen_port,
                                                                   step):
    """Found by the 2-minute soak: a subscriber restarted just before the key server was
    killed found it up, then had its next call refused ("connection refused") and exited
    2: the wait covered the first answer only. Now each call of the start waits through
    the restart and is made again. On the default ``--listen 127.0.0.1:0`` the refused
    call asks for the identity's held address; on a fixed port, for its keys. Control:
    with ``--server-wait 0`` the same start fails."""
    server = keyserver_factory.start()
    token = Cluster(server.base_url, server.admin_token, tmp_path).identity("starting",
                                                                             "root")
    port = listen_port if listen_port is not None else free_port()
    for wait, expected in (("0", 2), ("30", None)):
        relay = _BlinkingRelay(server.base_url, dark=4.0)
        cluster = Cluster(relay.url, server.admin_token, tmp_path / f"wait-{wait}")
        try:
            root = cluster.start_root("starting", ["symbol"], token=token,
                                      listen=f"127.0.0.1:{port}",
                                      extra=("--server-wait", wait))
            if expected is not None:
                assert root.process.wait(30) == expected
                assert "connection refused" in root.log_tail()
            else:
                cluster.wait_ready([root], timeout=30)
                assert (f"{relay.url} went down while this peer asked for {step}"
                        in root.log_tail(80))
                assert f"waiting for {step} from the key server at" in root.log_tail(80)
                assert relay.accepted >= 2  # it asked again once the relay was back
        finally:
            cluster.stop_all()
            relay.close()
