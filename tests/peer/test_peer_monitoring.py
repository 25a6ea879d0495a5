"""Operating peers: /healthz, /status and /metrics of real peer processes, `peer status`,
JSON log lines (also with hostile strings), and the tree picture of a simulated run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import httpx
import pytest

from ibe_pubsub.credentials.logsafe import JsonFormatter, log_formatter
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.delays import Setting
from ibe_pubsub.evaluation.launcher import cli_command, free_port
from ibe_pubsub.evaluation.tree_plot import draw_trees, layout
from ibe_pubsub.evaluation.trees import settled_run
from ibe_pubsub.overlay.crypto_model import CostTable
from ibe_pubsub.overlay.simulator import LatencyModel
from ibe_pubsub.overlay.snapshot import tree_status

HOSTILE = 'evil\n2026-01-01 00:00:00 WARNING forged line\x1b[31m "quoted" \u2028end'


def _poll(url: str, until, timeout: float = 30.0) -> httpx.Response:
    """GET ``url`` until ``until(response)`` holds (connection errors: not yet up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            response = httpx.get(url, timeout=5)
            if until(response):
                return response
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} never became as expected"
        time.sleep(0.1)


def _status_command(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command("peer", "status", url), capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_peer_reports_health_status_and_metrics_over_http(keyserver_factory, tmp_path):
    """/healthz is false while the subscriber waits for a root and true once joined;
    /status lists its trees; its delivered counter equals what it delivered; `peer status`
    prints one line per tree and fails in one line on a dead URL or a non-peer; a busy
    --http port is a clear error; every log line is a JSON object."""
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path / "peers", verbose=True,
                      peer_args=("--http", "0", "--log-format", "json"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        sub = cluster.start_subscriber("sub", 'symbol prefix "IB"',
                                       extra=("--http", str(port)))
        waiting = _poll(url + "/healthz", lambda r: r.json()["enrolled"])
        assert waiting.status_code == 503 and waiting.json()["ok"] is False
        assert waiting.json()["trees"] == {"symbol": False}

        root = cluster.start_root("root", ["symbol", "price", "volume"])
        cluster.wait_ready([root, sub])
        healthy = _poll(url + "/healthz", lambda r: r.status_code == 200)
        assert healthy.json() == {"ok": True, "enrolled": True, "trees": {"symbol": True},
                                  "stopping": False, "failure": None}
        assert sub.http == url

        events = [Event("a", {"symbol": "IBM", "price": 10.0, "volume": 5}),
                  Event("b", {"symbol": "INTC", "price": 10.0, "volume": 5}),
                  Event("c", {"symbol": "IBX", "price": 20.0, "volume": 5})]
        assert cluster.publish("pub", events).returncode == 0
        cluster.wait_deliveries({"sub": {"a", "c"}}, timeout=30, settle=0.5)
        assert sub.counter("ibe_peer_events_delivered_total") == len(sub.delivered()) == 2
        assert sub.counter("ibe_peer_events_false_positives_total") == 1
        assert root.counter("ibe_peer_events_forwarded_total") >= 3

        status = sub.get("/status").json()
        assert (status["identity"], status["role"], status["ready"]) == ("sub", "subscriber",
                                                                        True)
        (vp,) = status["trees"]["symbol"]["virtual_peers"]
        assert vp["parents"][0]["address"] == root.address and "credential" not in vp
        assert sub.get("/nowhere").status_code == 404

        shown = _status_command(root.http or "")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith(f"peer {root.address}: identity root, role root")
        assert [line.split(":")[0] for line in lines[1:]] == [
            "tree price", "tree symbol", "tree volume"]
        for bad, why in ((f"http://127.0.0.1:{free_port()}", "cannot reach"),
                         (server.base_url, "is not a peer's status endpoint")):
            failed = _status_command(bad)
            assert failed.returncode == 2 and failed.stdout == ""
            assert failed.stderr.count("\n") == 1 and why in failed.stderr

        busy = subprocess.run(
            cli_command("peer", "run", "--server", server.base_url, "--subscribe", "",
                        "--http", f"127.0.0.1:{port}"),
            env=cluster._env(cluster.identity("busy", "subscriber")), capture_output=True,
            text=True, timeout=60, check=False)
        assert busy.returncode == 2 and busy.stderr.count("\n") == 1
        assert f"--http: cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        cluster.stop_all()
    for peer in cluster.peers.values():
        lines = peer.log_file.read_text().splitlines()
        assert lines and all(isinstance(json.loads(line), dict) for line in lines)


def test_key_server_logs_every_line_as_json_uvicorn_included(keyserver_factory):
    """``keyserver serve --log-format json``: uvicorn's own lines (start-up, the access
    log) go through the same JSON formatter as the server's, one object per line."""
    server = keyserver_factory.start(serve_args=("--log-format", "json", "-v"))
    path = "/%0Aforged%1B%5B31m%22q%22"
    assert httpx.get(server.base_url + path).status_code == 404
    docs = [json.loads(line) for line in
            (server.data_dir / "server.log").read_text().splitlines()]
    assert any(d["logger"] == "uvicorn.access" and path in d["message"] for d in docs)
    assert any(d["message"].startswith("key server ready on") for d in docs)


@pytest.mark.parametrize("kind", ["json", "text"])
def test_hostile_strings_cannot_forge_log_lines(kind):
    record = logging.LogRecord("ibe_pubsub.peer.transport", logging.WARNING, "", 0,
                               "refused %s", (HOSTILE,), None)
    line = log_formatter(kind).format(record)
    assert "\n" not in line and "\x1b" not in line and "\u2028" not in line
    if kind == "json":
        assert json.loads(line)["message"] == f"refused {HOSTILE}"
    # Control: the same record through a plain formatter forges a line.
    assert "\n" in logging.Formatter("%(message)s").format(record)


def test_json_formatter_keeps_the_exception_in_the_line():
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "", 0, "failed", None,
                                   sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and HOSTILE in json.loads(line)["exception"]


def test_tree_picture_is_drawn_from_the_machines_state(tmp_path):
    setting = Setting(default_schema(), CostTable.default(), LatencyModel(), 1)
    sim, _ = settled_run(setting, 6, 2)
    statuses = [{"address": a, "trees": tree_status(m)} for a, m in sim.machines.items()]
    panels = layout(statuses)
    assert [p.attribute for p in panels] == sorted(default_schema().names)
    for panel in panels:
        vps = {(a, vp.vp): vp for a, m in sim.machines.items() for vp in m.vpeers.values()
               if vp.attribute == panel.attribute}
        assert set(panel.places) == set(vps)
        assert sorted(panel.edges) == sorted((k, p) for k, vp in vps.items()
                                             for p in vp.parents)
        assert [k for k, kind in panel.kind.items() if kind == "root"] == [
            (sim.roots[panel.attribute], vp.vp) for vp in
            sim.machines[sim.roots[panel.attribute]].vpeers.values()
            if vp.attribute == panel.attribute and vp.is_top]
        assert all((panel.kind[k] == "relay") == (vp.relay and not vp.is_top)
                   for k, vp in vps.items())
    path = tmp_path / "trees.png"
    draw_trees(statuses, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
