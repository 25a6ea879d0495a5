"""``ibe-pubsub bridge``: every command has --help, a missing client library is one line and
a non-zero exit, and the MQTT in-bridge run as a command (its broker from the environment)
publishes into the overlay, refuses a malformed message with a log line, and on SIGTERM
prints its summary and writes its counters."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from bridge_helpers import TOPICS, message, send, until

import ibe_pubsub.bridges
from ibe_pubsub.cli import main
from ibe_pubsub.client import Subscriber
from ibe_pubsub.evaluation.launcher import cli_command

pytestmark = pytest.mark.timeout(90)

COMMANDS = [["bridge"], ["bridge", "mqtt"], ["bridge", "nats"],
            *(["bridge", kind, way] for kind in ("mqtt", "nats") for way in ("in", "out"))]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_bridge_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert "usage: ibe-pubsub " + " ".join(command) in capsys.readouterr().out


def test_a_missing_client_library_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "aiomqtt", None)  # import aiomqtt fails
    monkeypatch.delitem(sys.modules, "ibe_pubsub.bridges.mqtt", raising=False)
    monkeypatch.delitem(vars(ibe_pubsub.bridges), "MqttBroker", raising=False)  # no load
    status = main(["bridge", "mqtt", "in", "--server", "127.0.0.1:1", "--token", "t",
                   "--advertise", "", "--topic", "sensors/#"])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "ibe-pubsub: error: the MQTT client aiomqtt is missing: install ibe-pubsub[bridges]"]


@pytest.mark.parametrize("broker", ["mqtt"], indirect=True)
def test_the_mqtt_in_bridge_command(overlay, broker, tmp_path):
    sub_token = overlay.cluster.identity("cli-bridge-sub", "subscriber")
    pub_token = overlay.cluster.identity("cli-bridge-pub", "publisher")
    source, topic, _, _ = TOPICS["mqtt"]
    ready, stats, log = tmp_path / "ready.json", tmp_path / "stats.json", tmp_path / "err"
    env = {**os.environ, "IBE_PUBSUB_TOKEN": pub_token,
           "IBE_PUBSUB_BROKER": f"127.0.0.1:{broker.port}"}
    command = cli_command("bridge", "mqtt", "in", "--server", overlay.server,
                          "--known-servers", str(overlay.known_servers), "--advertise", "",
                          "--topic", source, "--ready-file", str(ready),
                          "--stats-out", str(stats))

    async def run() -> subprocess.Popen[bytes]:
        async with await Subscriber.connect(overlay.server, sub_token, 'symbol prefix "IB"',
                                            **overlay.trust()) as subscriber:
            with log.open("wb") as err:
                process = subprocess.Popen(command, env=env, stderr=err)
            try:
                await until(lambda: ready.exists() or process.poll() is not None,
                            "the bridge ready", 30)
                assert process.poll() is None, log.read_text()
                good = {"id": "cli-1", "values": {"symbol": "IBM", "price": 1.5, "volume": 2}}
                await send("mqtt", broker.port, topic, [b"[1, 2", message(good)])
                delivered = await subscriber.next(timeout=20)
                assert (delivered.id, delivered.values["price"]) == ("cli-1", 1.5)
            finally:
                process.send_signal(signal.SIGTERM)
                await until(lambda: process.poll() is not None, "the bridge stopped", 20)
        return process

    process = asyncio.run(run())
    err = log.read_text()
    assert process.returncode == 0, err
    assert json.loads(ready.read_text())["topic"] == source
    assert f"refused message from {topic}: not JSON: Expecting" in err
    summary = err.strip().splitlines()[-1]
    assert summary.startswith(f"bridge in (the MQTT broker at 127.0.0.1:{broker.port}, "
                              f"{source}): 2 received, 1 forwarded, 1 refused, 0 dropped")
    assert json.loads(stats.read_text()) == {"received": 2, "forwarded": 1, "refused": 1,
                                             "dropped": 0, "unsent": 0, "resent": 0,
                                             "outages": 0}


def test_an_out_bridge_refuses_a_topic_field_the_schema_lacks_and_leaves(overlay):
    token = overlay.cluster.identity("cli-bridge-bad-template", "subscriber")
    result = subprocess.run(
        cli_command("bridge", "nats", "out", "--server", overlay.server, "--known-servers",
                    str(overlay.known_servers), "--subscribe", 'symbol prefix "IB"',
                    "--topic", "quotes.{colour}"),
        env={**os.environ, "IBE_PUBSUB_TOKEN": token}, capture_output=True, text=True,
        timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "ibe-pubsub: error: bridge could not start: topic template 'quotes.{colour}': no "
        "attribute colour in the schema")
