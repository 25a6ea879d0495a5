"""docs/api.md cannot rot: each Python block there is, verbatim, a program of docs/examples,
and the programs run here as a user runs them (subprocesses configured by IBE_PUBSUB_*
variables, the key server's key pinned) against a real key server and root peer process:
each subscriber prints exactly the events its subscription matches, from both publishers,
and the quote outside the advertisement is refused and reaches nobody."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from repository import REPO_ROOT

from ibe_pubsub.client import load_options
from ibe_pubsub.credentials import default_schema, parse_predicate
from ibe_pubsub.evaluation.launcher import child_env

pytestmark = pytest.mark.timeout(150)

API = REPO_ROOT / "docs" / "api.md"
EXAMPLES = REPO_ROOT / "docs" / "examples"
BLOCK = re.compile(r"<!-- (\w+): (\S+) -->\n```(\w+)\n(.*?)```\n", re.DOTALL)


def _blocks() -> list[tuple[str, str, str, str]]:
    """(marker, name, language, text) of every marked code block of docs/api.md."""
    return BLOCK.findall(API.read_text(encoding="utf-8"))


def test_every_python_block_of_the_api_doc_is_an_example_file_verbatim():
    text = API.read_text(encoding="utf-8")
    blocks = _blocks()
    assert text.count("```python") == sum(lang == "python" for _, _, lang, _ in blocks)
    shown = {name for marker, name, lang, code in blocks if marker == "example"}
    for marker, name, lang, code in blocks:
        if marker == "example":
            assert lang == "python" and code == (REPO_ROOT / name).read_text(), name
    assert shown == {f"docs/examples/{p.name}" for p in EXAMPLES.glob("*.py")}


def test_the_configuration_block_is_read_as_documented(tmp_path):
    [(_, name, _, toml)] = [b for b in _blocks() if b[0] == "config"]
    path = tmp_path / name
    path.write_text(toml)
    tomllib.loads(toml)
    options = load_options("subscriber", config_file=path, environ={})
    assert set(options) == {"server", "subscription", "known_servers"}
    assert load_options("publisher", config_file=path, environ={})["advertisement"] == \
        "price < 500"


def _example(name: str, *args: str, env: dict[str, str], cwd: Path, out: Path
             ) -> subprocess.Popen[bytes]:
    with (out / f"{name}.out").open("wb") as stdout, (out / f"{name}.err").open("wb") as err:
        return subprocess.Popen([sys.executable, str(EXAMPLES / f"{name}.py"), *args],
                                env=env, cwd=cwd, stdout=stdout, stderr=err)


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert process.poll() is None, f"{path.name}: exited\n{path.read_text()}"
        assert time.monotonic() < deadline, f"{path.name}: no {text!r}\n{path.read_text()}"
        time.sleep(0.05)


def test_the_examples_deliver_exactly_what_each_subscription_matches(overlay, tmp_path):
    cluster = overlay.cluster
    [server_key] = json.loads(overlay.known_servers.read_text()).values()
    base = {k: v for k, v in child_env().items() if not k.startswith("IBE_PUBSUB_")}
    base |= {"IBE_PUBSUB_SERVER": overlay.server, "IBE_PUBSUB_SERVER_KEY": server_key,
             "XDG_CONFIG_HOME": str(tmp_path / "config")}
    subscribers = {"subscribe_async": 'symbol prefix "IB"', "subscribe_callback": "price >= 100",
                   "subscribe_sync": "volume >= 300"}
    running = {}
    for name, subscription in subscribers.items():
        env = base | {"IBE_PUBSUB_TOKEN": cluster.identity(name, "subscriber"),
                      "IBE_PUBSUB_SUBSCRIBE": subscription}
        running[name] = _example(name, "3", env=env, cwd=tmp_path, out=tmp_path)
    try:
        for name, process in running.items():
            _wait_for(tmp_path / f"{name}.err", "subscribed at", process, timeout=60)
        env = base | {"IBE_PUBSUB_TOKEN": cluster.identity("publisher", "publisher")}
        first = subprocess.run([sys.executable, str(EXAMPLES / "publish_async.py")], env=env,
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stderr
        assert "refused: event " in first.stderr and "outside the advertisement" in first.stderr
        quotes = ["IBM:99.5:50", "ORCL:300.0:1000"]
        second = subprocess.run([sys.executable, str(EXAMPLES / "publish_sync.py"), *quotes],
                                env=env, cwd=tmp_path, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 0, second.stderr
        for name, process in running.items():
            assert process.wait(timeout=60) == 0, (tmp_path / f"{name}.err").read_text()
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
    published = [("MSFT", 30.5, 100), ("IBMX", 50.0, 200), ("AAPL", 150.0, 300),
                 ("IBM", 120.25, 500), ("IBM", 99.5, 50), ("ORCL", 300.0, 1000)]
    ids = first.stdout.split() + second.stdout.split()
    assert len(ids) == len(published) == len(set(ids))
    schema = default_schema()
    for name, subscription in subscribers.items():
        predicate = parse_predicate(schema, subscription)
        expected = {(i, symbol, price, volume) for i, (symbol, price, volume)
                    in zip(ids, published, strict=True)
                    if predicate.matches({"symbol": symbol, "price": price, "volume": volume})}
        lines = [json.loads(line) for line in (tmp_path / f"{name}.out").read_text().splitlines()]
        got = {(d["id"], d["values"]["symbol"], d["values"]["price"], d["values"]["volume"])
               for d in lines}
        assert len(expected) == len(lines) == 3 and got == expected, name
        assert all(d["body"] == f"{d['values']['symbol']} at {d['values']['price']}"
                   for d in lines)
