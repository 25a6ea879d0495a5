"""The `ibe-pubsub` dispatcher: help, layered configuration, the crypto benchmark."""

from __future__ import annotations

import json
import subprocess
import sys

CLI = [sys.executable, "-m", "ibe_pubsub.cli"]


def run(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)


def test_every_command_has_help():
    top = run("--help")
    assert top.returncode == 0 and "bench" in top.stdout
    crypto = run("bench", "crypto", "--help")
    assert crypto.returncode == 0 and "--dims" in crypto.stdout
    add = run("identity", "add", "--help")
    assert "publisher (`publish`)" in " ".join(add.stdout.split())  # what each --role does


def test_version_comes_from_the_installed_package():
    from importlib.metadata import version

    shown = run("--version")
    assert (shown.returncode, shown.stdout) == (0, f"ibe-pubsub {version('ibe-pubsub')}\n")


def test_without_the_bench_extra_a_benchmark_says_what_to_install_before_it_runs(tmp_path):
    out = tmp_path / "crypto.json"
    hidden = ("import sys; sys.modules['matplotlib'] = None\n"
              "from ibe_pubsub.cli import main; sys.exit(main(sys.argv[1:]))")
    for command in (["bench", "crypto", "--json", str(out), "--dims", "1", "--bits", "4"],
                    ["demo", "--graph", str(tmp_path / "trees.png")]):
        result = subprocess.run([sys.executable, "-c", hidden, *command],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == ["ibe-pubsub: error: plots need matplotlib: "
                                              "pip install 'ibe-pubsub[bench]'"]
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing ran


def test_bench_crypto_writes_json_and_plot(tmp_path):
    out = tmp_path / "crypto.json"
    result = run("bench", "crypto", "--json", str(out), "--dims", "1", "--bits", "4",
                 "--min-seconds", "0.01")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 1000
    names = {r["algorithm"] for r in report["algorithms"]}
    assert {"encrypt_and_sign", "decrypt", "verify"} <= names
    for row in report["algorithms"]:
        assert row["floor_ms"] > 0 and row["ms"] > 0
    ops = {r["algorithm"]: r["ops_per_call"] for r in report["algorithms"]}
    # decryption: one route pairing per attribute (d = 1), then one multi-pairing of 2d + 1;
    # verification: one multi-pairing
    assert ops["decrypt"]["final_exp"] == 2 and ops["decrypt"]["miller_loop"] >= 3
    assert ops["verify"]["final_exp"] == 1
    # version 3: a share's equations in one multi-pairing of 5 + credentials Miller loops
    assert ops["verify_subscriber_share"]["final_exp"] == 1
    assert ops["verify_subscriber_share"]["miller_loop"] == 5 + 1
    assert "combine_subscriber_key" in ops and "keyshare_subscriber" in ops
    assert "raw operations" in result.stderr  # progress goes to stderr


def test_configuration_layers(tmp_path):
    import os
    config = tmp_path / "conf.toml"
    config.write_text('[bench.crypto]\ndims = "1"\nbits = "3"\nmin_seconds = 0.01\n'
                      f'json = "{tmp_path / "from-toml.json"}"\n')
    env = {**os.environ, "IBE_PUBSUB_CONFIG": str(config)}
    assert run("bench", "crypto", env=env).returncode == 0
    assert (tmp_path / "from-toml.json").exists()
    env["IBE_PUBSUB_JSON"] = str(tmp_path / "from-env.json")
    assert run("bench", "crypto", env=env).returncode == 0
    assert (tmp_path / "from-env.json").exists()
    flag = tmp_path / "from-flag.json"
    assert run("bench", "crypto", "--json", str(flag), env=env).returncode == 0
    assert flag.exists()


def test_configuration_errors_are_reported(tmp_path):
    import os
    bad = tmp_path / "bad.toml"
    bad.write_text("[bench.crypto]\nnot_an_option = 1\n")
    result = run("--config", str(bad), "bench", "crypto")
    assert result.returncode == 2 and "not_an_option" in result.stderr
    bad.write_text("this is = = not toml")
    result = run("--config", str(bad), "bench", "crypto")
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    env = {**os.environ, "IBE_PUBSUB_DIMS": "x,y"}
    result = run("bench", "crypto", env=env)
    assert result.returncode == 2 and "IBE_PUBSUB_DIMS" in result.stderr
    result = run("bench", "crypto", "--backend", "nope")
    assert result.returncode == 2


def test_configuration_keys_take_hyphens_and_every_table_must_name_a_command(tmp_path):
    config = tmp_path / "conf.toml"
    options = f'dims = "1"\nbits = "3"\nmin-seconds = 0.01\njson = "{tmp_path / "out.json"}"\n'
    config.write_text("[bench.crypto]\n" + options)
    done = run("--config", str(config), "bench", "crypto")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.json").exists()
    for table, message in [("[bench]", "[bench] is a group, not a command: use [bench.bulk]"),
                           ("[bench.crypt]", "[bench.crypt] is not a command"),
                           ("[bench.crypto.x]", "[bench.crypto] has no subcommands")]:
        config.write_text(f"{table}\n{options}")
        refused = run("--config", str(config), "bench", "crypto")
        assert refused.returncode == 2 and message in refused.stderr, table
        assert refused.stderr.count("\n") == 1, refused.stderr
    config.write_text("[bench.crypto]\nmin-second = 1\n")
    refused = run("--config", str(config), "bench", "crypto")
    assert "unknown option(s) in [bench.crypto]: min_second (valid: " in refused.stderr
    assert "min_seconds" in refused.stderr


def test_required_options_can_come_from_the_environment(tmp_path):
    import os
    env = {**os.environ, "IBE_PUBSUB_SERVER": "http://127.0.0.1:9",
           "IBE_PUBSUB_ADMIN_TOKEN": "not-checked-before-connecting"}
    without = run("identity", "list")
    assert without.returncode == 2 and "required: --server" in without.stderr
    with_env = run("identity", "list", env=env)
    # both came from the environment: parsing passed, and the command tried that server
    assert with_env.returncode == 2
    assert with_env.stderr.strip() == (
        "ibe-pubsub: error: cannot reach the key server at http://127.0.0.1:9: "
        "connection refused")


def _parsers(parser, path=()):
    """(command path, parser) of every parser in the tree, however deep."""
    import argparse
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_every_help_shows_its_defaults():
    import argparse

    from ibe_pubsub.cli.app import build_parser

    helps = {}
    for path, parser in _parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        helps[" ".join(path)] = text
        assert "(default: None)" not in text and "(default: False)" not in text, path
        formatter = parser._get_formatter()  # the one --help uses
        for action in parser._actions:
            meaningful = action.option_strings and action.default not in (
                None, False, "", [], argparse.SUPPRESS) and not isinstance(
                action, argparse._CountAction | argparse._HelpAction)
            if meaningful:
                assert "default" in formatter._get_help_string(action).lower(), (
                    path, action.option_strings)
    assert {"keyserver serve", "bench crypto", "crypto vectors", "bulk issue",
            "identity list"} <= set(helps)
    for command, shown in (("keyserver serve", "--port PORT listen port (default: 8700)"),
                           ("peer run", "(same for all peers) (default: ohf)"),
                           ("peer run", "children per virtual peer (default: 4)"),
                           ("publish", "to register (default: 30.0)"),
                           ("demo", "--peers PEERS subscriber processes (default: 8)"),
                           ("bench keyserver", "output JSON file (default: "
                                               "bench/keyserver.json)"),
                           ("bench transport", "(default: bench/transport.json)")):
        assert shown in helps[command], (command, shown)
    # a default the help text states already is not said twice
    assert "(default 1,2,4,8)" in helps["bench crypto"]
    assert "(default: 1,2,4,8)" not in helps["bench crypto"]


def test_global_options_are_accepted_after_the_command(tmp_path):
    from ibe_pubsub.cli.app import build_parser

    parser = build_parser()
    assert parser.parse_args(["peer", "run", "--server", "s"]).verbose == 0
    assert parser.parse_args(["-v", "peer", "run", "-v", "--server", "s"]).verbose == 2
    assert parser.parse_args(["peer", "-v", "run", "-vv", "--server", "s"]).verbose == 3
    assert parser.parse_args(["demo", "--config", "f.toml"]).config == "f.toml"
    bad = tmp_path / "bad.toml"
    bad.write_text("[bench.crypto]\nnot_an_option = 1\n")
    after = run("bench", "crypto", "--config", str(bad), "-v")
    assert after.returncode == 2 and "not_an_option" in after.stderr
    bad.write_text("[bench.crypto]\nverbose = 1\n")  # a global option, not the command's
    assert "unknown option(s) in [bench.crypto]: verbose" in run(
        "--config", str(bad), "bench", "crypto").stderr


def test_bench_streams_writes_json_and_plot(tmp_path):
    out = tmp_path / "streams.json"
    result = run("bench", "streams", "--json", str(out), "--seconds", "0.01")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 1000
    assert list(report) == ["scenarios"]
    rows = report["scenarios"]
    assert list(rows) == ["fresh", "reused", "ticks", "ticks8"]
    for row in rows.values():
        assert row["publisher_events_per_s"] > 0 and row["subscriber_floor_events_per_s"] > 0
    fresh, reused = rows["fresh"], rows["reused"]
    # fresh: a G1 and a GT exponentiation per position; reused: no pairing after the first
    assert fresh["publisher_ops_per_event"]["exp_G1_ct"] >= 40
    assert reused["subscriber_ops_per_event"].get("final_exp", 0) < 0.2
    assert reused["publisher_events_per_s"] > 10 * fresh["publisher_events_per_s"]
    refused = run("bench", "streams", "--seconds", "0")
    assert refused.returncode != 0 and "--seconds must be more than 0" in refused.stderr


def test_stream_options_are_checked_from_flags_and_the_configuration_file(tmp_path):
    base = ("publish", "--server", "http://127.0.0.1:9", "--token", "t", "--advertise", "",
            "--events", "-")
    flag = run(*base, "--stream-window", "0s")
    assert flag.returncode == 2 and "must be a positive duration" in flag.stderr
    config = tmp_path / "ibe-pubsub.toml"
    config.write_text('[publish]\nstream_window = "250ms"\nstream_max_events = 0\n')
    layered = run("--config", str(config), *base)
    assert layered.returncode == 2
    # the file's number meets the option's own type, as the same flag would
    assert layered.stderr.strip().splitlines() == [
        "ibe-pubsub: error: [publish] stream_max_events: must be at least 1, got 0"]


def test_a_toml_number_or_list_is_checked_like_the_same_flag(tmp_path, capsys):
    from ibe_pubsub.cli.app import main

    config = tmp_path / "conf.toml"
    config.write_text("[bench.exactness]\nseeds = 0\n")
    assert main(["--config", str(config), "bench", "exactness", "--help"]) == 2
    assert "seeds" in capsys.readouterr().err
    config.write_text("[bench.exactness]\nsubscribers = [40, 0]\n")
    assert main(["--config", str(config), "bench", "exactness", "--help"]) == 2
    assert "at least 1" in capsys.readouterr().err
    # Control: valid numbers and lists from the file are taken, typed.
    from ibe_pubsub.cli.app import _leaf, build_parser
    from ibe_pubsub.cli.config import apply_layers

    leaf, path = _leaf(build_parser(), ["bench", "exactness"])
    apply_layers(leaf, path, {"bench": {"exactness": {"seeds": 3, "subscribers": [40, 7]}}})
    assert (leaf.get_default("seeds"), leaf.get_default("subscribers")) == (3, [40, 7])
