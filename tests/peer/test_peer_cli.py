"""`peer run` / `publish` refusals and the events files, against a real key server."""

from __future__ import annotations

import json
import subprocess

import pytest

from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.keyserver.client import KeyServerClient
from ibe_pubsub.peer.events_io import EventFileError, EventWriter, read_events

QUOTE = {"symbol": "IBM", "price": 10.5, "volume": 7}


def run(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("IBE_PUBSUB_TOKEN", None)
    if token:
        env["IBE_PUBSUB_TOKEN"] = token
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def write_lines(path, objects) -> str:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n"
                            for o in objects))
    return str(path)


def test_help_for_every_command():
    for command in (["peer", "run"], ["publish"], ["demo"]):
        result = run(*command, "--help")
        assert result.returncode == 0 and "usage:" in result.stdout


def test_peer_run_needs_exactly_one_role():
    result = run("peer", "run", "--server", "http://127.0.0.1:9", token="t")
    assert result.returncode == 2 and "exactly one of --subscribe" in result.stderr
    both = run("peer", "run", "--server", "http://127.0.0.1:9", "--subscribe", "",
               "--root", "price", token="t")
    assert both.returncode == 2 and "exactly one of" in both.stderr
    unreachable = run("peer", "run", "--server", "http://127.0.0.1:9", "--subscribe", "",
                      "--server-wait", "0", token="t")
    assert unreachable.returncode == 2 and "could not start" in unreachable.stderr


def test_peer_run_refuses_a_wildcard_listen_address():
    for listen in ("0.0.0.0:7000", "[::]:0", "[0::0]:7000", "[::ffff:0.0.0.0]:7000"):
        result = run("peer", "run", "--server", "http://127.0.0.1:9", "--subscribe", "",
                     "--listen", listen, token="t")
        assert result.returncode == 2
        assert result.stderr.startswith("ibe-pubsub: error: --listen must be an address "
                                        "other peers can dial, not ")
        assert len(result.stderr.splitlines()) == 1
    # the control: a dialable address passes the check (and the start fails later; no
    # wait for the key server that is not there)
    dialable = run("peer", "run", "--server", "http://127.0.0.1:9", "--subscribe", "",
                   "--listen", "127.0.0.1:0", "--server-wait", "0", token="t")
    assert dialable.returncode == 2 and "could not start" in dialable.stderr


def test_peer_run_refuses_a_demotion_threshold_beyond_its_window():
    base = ("peer", "run", "--server", "http://127.0.0.1:9", "--subscribe", "")
    too_many = run(*base, "--demote-after", "17", token="t")
    assert too_many.returncode == 2 and "--demote-after: invalid choice" in too_many.stderr
    # the control: the greatest choice passes (and the start fails later)
    at_most = run(*base, "--routing", "mcr", "--push-backup", "--demote-after", "16",
                  "--server-wait", "0", token="t")
    assert at_most.returncode == 2 and "could not start" in at_most.stderr


def test_read_events_refuses_bad_files(tmp_path):
    schema = default_schema()
    ad = parse_predicate(schema, "price < 500")
    good = write_lines(tmp_path / "good.jsonl", [{"id": "a", "values": QUOTE, "body": "x"}, ""])
    assert read_events(good, schema, ad) == [Event("a", QUOTE, b"x")]
    cases = {
        "not JSON": ["{"],
        "duplicate id": [{"id": "a", "values": QUOTE}, {"id": "a", "values": QUOTE}],
        "outside the advertisement": [{"id": "b", "values": QUOTE | {"price": 600.0}}],
        "unknown field": [{"id": "c", "values": QUOTE, "extra": 1}],
        "'id' must be": [{"values": QUOTE}],
        "missing from the event": [{"id": "d", "values": {"symbol": "IBM"}}],
        "'body' must be a string": [{"id": "e", "values": QUOTE, "body": 3}],
        "expected a JSON object": [[1, 2]],
    }
    for expected, lines in cases.items():
        with pytest.raises(EventFileError, match=expected):
            read_events(write_lines(tmp_path / "bad.jsonl", lines), schema, ad)
    with pytest.raises(EventFileError, match="cannot read"):
        read_events(str(tmp_path / "missing.jsonl"), schema, ad)


def test_event_writer_flushes_json_lines(tmp_path):
    out = tmp_path / "out.jsonl"
    writer = EventWriter(str(out))
    writer.write(Event("a", QUOTE, b"hello"), delivered_at=5.0)
    writer.write(Event("b", QUOTE, b"\xff\xfe"))
    lines = [json.loads(x) for x in out.read_text().splitlines()]  # flushed, not closed
    writer.close()
    assert lines[0] == {"id": "a", "values": QUOTE, "body": "hello", "delivered_at": 5.0}
    assert lines[1]["body_base64"] == "//4=" and "body" not in lines[1]


def test_publish_refusals(keyserver, tmp_path):
    with KeyServerClient(keyserver.base_url, keyserver.admin_token) as admin:
        token = admin.create_identity("peer-cli-pub", "publisher", "price < 500")["token"]
    events = write_lines(tmp_path / "e.jsonl", [{"id": "ok", "values": QUOTE},
                                                {"id": "far", "values": QUOTE | {"price": 700}}])
    base = ("publish", "--server", keyserver.base_url, "--root-timeout", "0")
    outside = run(*base, "--advertise", "price < 500", "--events", events, token=token)
    assert outside.returncode == 2
    assert "'far' lies outside the advertisement" in outside.stderr
    beyond = run(*base, "--advertise", "price < 800", "--events", events, token=token)
    assert beyond.returncode == 2 and "exceeds the identity's policy" in beyond.stderr
    no_token = run(*base, "--advertise", "", "--events", events)
    assert no_token.returncode == 2 and "--token" in no_token.stderr
    bad_token = run(*base, "--advertise", "", "--events", events, token="nope")
    assert bad_token.returncode == 2 and "401" in bad_token.stderr
