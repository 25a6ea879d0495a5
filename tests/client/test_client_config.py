"""The client's configuration, read as the CLI reads it (explicit > IBE_PUBSUB_* > the TOML
file's [peer.run] or [publish] table), and its errors: one ClientError for every failure,
with the message the CLI prints, against a real key server that has no root yet."""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyserver_fixtures import KeyServer, KeyServers

from ibe_pubsub.client import (
    ClientError,
    ConfigError,
    ConnectError,
    ConnectTimeout,
    Publisher,
    Subscriber,
    ThresholdAccess,
    load_options,
)
from ibe_pubsub.client.config import server_trust
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.keyserver import KeyServerClient

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[peer.run]
server = "http://file:1"
token = "file-token"
subscribe = 'symbol prefix "IB"'
insecure-transport = true
events-out = "only/for/the/command.jsonl"
routing = "mcr"

[publish]
server = "http://file:1"
advertise = "price < 100"
stream-window = "250ms"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.toml"
    path.write_text(CONFIG)
    return path


def test_explicit_arguments_beat_the_environment_which_beats_the_file(config_file):
    env = {"IBE_PUBSUB_TOKEN": "env-token", "IBE_PUBSUB_LISTEN": "127.0.0.1:9200",
           "IBE_PUBSUB_CONFIG": str(config_file)}
    assert load_options("subscriber", environ=env, token=None) == {
        "server": "http://file:1", "token": "env-token", "subscription": 'symbol prefix "IB"',
        "insecure_transport": True, "listen": "127.0.0.1:9200"}
    explicit = load_options("subscriber", environ=env, token="mine", subscription="")
    assert (explicit["token"], explicit["subscription"]) == ("mine", "")
    env |= {"IBE_PUBSUB_STREAM_MAX_EVENTS": "5", "IBE_PUBSUB_INSECURE_TRANSPORT": "no"}
    assert load_options("publisher", environ=env) == {
        "server": "http://file:1", "token": "env-token", "advertisement": "price < 100",
        "stream_window": 0.25, "stream_max_events": 5, "insecure_transport": False}


def test_the_file_is_the_one_named_else_the_working_directorys(config_file, tmp_path,
                                                                  monkeypatch):
    assert load_options("publisher", config_file=config_file, environ={})["server"] == \
        "http://file:1"
    monkeypatch.chdir(tmp_path)
    assert load_options("publisher", environ={}) == {}
    (tmp_path / "ibe-pubsub.toml").write_text('[publish]\nserver = "http://cwd:2"\n')
    assert load_options("publisher", environ={}) == {"server": "http://cwd:2"}


def test_a_threshold_deployment_in_a_higher_layer_replaces_the_key_server(config_file,
                                                                           tmp_path):
    """The file names a key server; the environment a threshold deployment, which wins
    (and an explicit server wins over that). Both named in one layer, or half a deployment,
    are ConfigErrors."""
    deployment = {"IBE_PUBSUB_THRESHOLD_FILE": "threshold.json",
                  "IBE_PUBSUB_THRESHOLD_ACCESS": "alice.json"}
    env = {"IBE_PUBSUB_CONFIG": str(config_file)} | deployment
    options = load_options("subscriber", environ=env)
    assert options["server"] == ThresholdAccess("threshold.json", "alice.json")
    assert options["subscription"] == 'symbol prefix "IB"'  # the rest of the file stays
    assert load_options("subscriber", environ=env, server="http://mine:3")["server"] == \
        "http://mine:3"
    assert load_options("publisher", config_file=config_file, environ={},
                        threshold_file="t.json", threshold_access="a.json")["server"] == \
        ThresholdAccess("t.json", "a.json")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="not both"):
        load_options("subscriber", config_file=empty,
                     environ=deployment | {"IBE_PUBSUB_SERVER": "http://x:1"})
    with pytest.raises(ConfigError, match="go together"):
        load_options("subscriber", config_file=empty,
                     environ={"IBE_PUBSUB_THRESHOLD_FILE": "threshold.json"})


@pytest.mark.parametrize(("text", "env", "message"), [
    ("[publish\n", {}, "is not valid TOML"),
    ('[publish]\nstream-window = "1s"\nstream_window = "2s"\n', {}, "sets stream_window twice"),
    ('[publish]\nstream-window = "soon"\n', {}, "expected a positive duration"),
    ("", {"IBE_PUBSUB_INSECURE_TRANSPORT": "maybe"}, "IBE_PUBSUB_INSECURE_TRANSPORT: expected a"),
])
def test_unusable_settings_are_config_errors(tmp_path, text, env, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_options("publisher", config_file=path, environ=env)
    with pytest.raises(ClientError, match="cannot read the configuration file"):
        load_options("publisher", environ={"IBE_PUBSUB_CONFIG": str(tmp_path / "none.toml")})


def test_the_server_key_is_pinned_or_else_recorded_in_the_clis_known_servers(monkeypatch,
                                                                             tmp_path):
    key = bytes(range(32))
    assert server_trust(base64.b64encode(key).decode(), None) == (key, None)
    with pytest.raises(ConfigError, match="32-byte"):
        server_trust(key[:8], None)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    _, known = server_trust(None, None)
    assert known is not None
    assert known.path == tmp_path / "ibe-pubsub" / "known_servers.json"


# -- against a key server with no root ---------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyServer]:
    servers = KeyServers(tmp_path_factory.mktemp("client-config"))
    try:
        yield servers.start()
    finally:
        servers.stop_all()


def test_a_wrong_token_is_a_client_error_with_the_message_the_cli_prints(server, tmp_path):
    known = tmp_path / "known_servers.json"
    with pytest.raises(ClientError) as refused:
        asyncio.run(Subscriber.connect(server.base_url, "not-a-token", "",
                                       known_servers=known))
    assert isinstance(refused.value, ConnectError)
    assert str(refused.value).startswith("key server answered 401")
    events = tmp_path / "events.jsonl"
    events.write_text("")
    env = child_env() | {"IBE_PUBSUB_TOKEN": "not-a-token",
                         "IBE_PUBSUB_KNOWN_SERVERS": str(known)}
    cli = subprocess.run(cli_command("publish", "--server", server.base_url, "--advertise", "",
                                     "--events", str(events)),
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode != 0
    assert cli.stderr.strip().splitlines()[-1].endswith(f": {refused.value}")


def test_no_root_to_join_is_a_connect_timeout_naming_the_trees(server, tmp_path):
    admin = KeyServerClient(server.base_url, server.admin_token)
    sub_token = admin.create_identity("lonely", "subscriber")["token"]
    pub_token = admin.create_identity("lonely-pub", "publisher")["token"]
    admin.close()
    known = tmp_path / "known_servers.json"
    # Long enough for its keys on a slow machine: what is left to wait for is a root.
    with pytest.raises(ConnectTimeout, match=r"did not join within 8 s: not attached in tree"):
        asyncio.run(Subscriber.connect(server.base_url, sub_token, "volume > 5",
                                       known_servers=known, ready_timeout=8))
    with pytest.raises(ConnectError, match="no root registered for price, symbol, volume"):
        asyncio.run(Publisher.connect(server.base_url, pub_token, "", known_servers=known,
                                      root_timeout=1))
