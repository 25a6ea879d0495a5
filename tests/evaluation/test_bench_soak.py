"""``bench soak``, shortened for CI: 2 minutes of real processes (a key server with 15 s
epochs, three roots, four subscribers in both routing modes, three live feeds) under every
fault of the schedule (subscriber kills, a SIGSTOP, a root and the key server killed and
restarted, a publisher revoked, and, as root, one subscriber in a network namespace of its
own behind a delaying, lossy link that is cut for 6 s), with nothing lost outside the
fault windows, no duplicate, no crash, nothing left running and every enrolment in the
audit log. Then the oracle is shown to catch each failure in that same run's record (the
controls)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from ibe_pubsub.credentials import default_schema, parse_predicate
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.evaluation.netns import GROUP_ADDRESS, unavailable
from ibe_pubsub.evaluation.soak_oracle import analyse, attached, passed

#: Alone on the machine (with the timing-sensitive tests): its fifteen processes would slow
#: whatever ran beside it, and fault windows are timings too.
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.serial]


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    done = subprocess.run(cli_command(
        "bench", "soak", "--minutes", "2", "--subscribers", "4", "--steady", "1",
        "--epoch-seconds", "15", "--grace-seconds", "4", "--kill-every", "10", "--drain", "8",
        "--seed", "3", "--group", "1", "--partition", "6",
        "--json", str(out)), env=child_env(), capture_output=True, text=True, timeout=500,
        check=False)
    assert out.exists(), done.stderr[-3000:]
    report = json.loads(out.read_text())
    record = json.loads((Path(report["workdir"]) / "record.json").read_text())
    assert done.returncode == (0 if report["passed"] else 1)
    assert out.with_suffix(".png").stat().st_size > 0
    return report, record


def test_a_short_soak_loses_nothing_outside_its_fault_windows(soak):
    report, record = soak
    verdict = report["verdict"]
    summary = {k: verdict[k] for k in ("lost_examples", "duplicate_examples", "crashed",
                                       "left_running", "audit_mismatches", "wrong_examples")}
    assert report["passed"], summary
    kinds = {"subscriber_kill", "subscriber_stop", "root_kill", "keyserver_kill", "revocation"}
    built = "skipped" not in report["network"]
    assert built == (unavailable() is None) or "could not be built" in report["network"][
        "skipped"]
    assert set(verdict["faults_by_kind"]) == kinds | ({"partition"} if built else set())
    assert verdict["faults_by_kind"]["subscriber_kill"] >= 6
    assert verdict["owed"] >= 200 and verdict["delivered"] + sum(
        verdict["missed_in_fault_windows"].values()) == verdict["owed"]
    # Seven rollovers at least (one every 15 s): every long-lived peer enrolled again at each.
    assert max(i["epoch"] or 0 for i in record["audit"]) >= 8
    assert record["revoked_at"] is not None and verdict["revocation_bound"] is not None
    assert all(w["from"] < w["at"] < w["to"] for w in verdict["fault_windows"])
    assert 0 < verdict["window_coverage"] <= 1
    # Through every kill, stop and cut around them, the processes that ran to the end hold
    # no more descriptors than their live connections explain (a socket left half-closed
    # per kill, a file never closed, would show here). One more is allowed: a kept-alive
    # connection to the killed key server stays half-closed until it is next used.
    rows = verdict["flatness"]
    assert {"sub-00", "pub-v2"} <= {r["name"] for r in rows}, rows
    assert all(r["held_fds_last"] <= r["held_fds_first"] + 1 for r in rows), rows


def _owed_delivery(record: dict, verdict: dict) -> tuple[str, int]:
    """A subscriber and the index of one of its deliveries that was owed outside every
    fault window."""
    windows = verdict["fault_windows"]
    incarnations: dict[str, list[dict]] = {}
    for inc in record["incarnations"]:
        incarnations.setdefault(inc["name"], []).append(inc)
    for name, deliveries in record["deliveries"].items():
        predicate = parse_predicate(default_schema(), record["subscriptions"][name])
        for k, (event_id, _) in enumerate(deliveries):
            sent = record["sent"].get(event_id)
            if sent is None or sent["publisher"] == "pub-revoked":
                continue
            t = sent["sent_at"] - record["started"]
            if (predicate.matches(sent["values"])
                    and attached(incarnations[name], sent["sent_at"])
                    and not any(w["from"] <= t <= w["to"] for w in windows)):
                probe = copy.deepcopy(record)
                del probe["deliveries"][name][k]
                assert analyse(probe)["lost"] == 1
                return name, k
    raise AssertionError("no owed delivery outside the fault windows")


def test_the_oracle_catches_a_loss_a_duplicate_a_late_revoked_event_and_a_crash(soak):
    """Controls: the same record with one owed delivery removed, one delivered twice, one
    of the revoked publisher's events delivered after its grace, a process that exited on
    its own, an enrolment missing from the audit log, a 500 from the key server: each
    fails the verdict."""
    report, record = soak
    assert passed(analyse(record)) and record["server_errors"] == {}
    name, k = _owed_delivery(record, report["verdict"])

    duplicated = copy.deepcopy(record)
    duplicated["deliveries"][name].append(duplicated["deliveries"][name][k])
    assert analyse(duplicated)["duplicates"] == 1

    late = copy.deepcopy(record)
    revoked = next(i for i, e in record["sent"].items() if e["publisher"] == "pub-revoked")
    bound = report["verdict"]["revocation_bound"]
    late["deliveries"][name].append([revoked, bound + 1.0])
    assert analyse(late)["revoked_after_grace"] == 1

    crashed = copy.deepcopy(record)
    victim = next(i for i in crashed["incarnations"] if i["role"] == "subscriber")
    victim["end"], victim["returncode"] = "exited", -11
    assert not passed(analyse(crashed))

    unaudited = copy.deepcopy(record)
    entry = next(e for e in unaudited["audit"] if e["action"] == "issue_subscriber")
    unaudited["audit"].remove(entry)
    assert analyse(unaudited)["audit_mismatches"][0]["identity"] == entry["actor"]

    assert not passed(analyse({**record, "server_errors": {"POST /v1/directory 500": 1}}))


def test_the_group_ran_behind_a_lossy_link_that_was_cut_and_healed(soak):
    """As root: the group's subscriber ran at the namespace's address, its link lost
    packets and dropped everything while cut, and it received events from both sides of
    the cut."""
    report, record = soak
    network = report["network"]
    if "skipped" in network:
        pytest.skip(f"no network namespaces here: {network['skipped']}")
    assert network["group"] == ["sub-03"]
    ready = Path(report["workdir"]) / "peers" / "sub-03.ready.json"
    assert json.loads(ready.read_text())["address"].startswith(GROUP_ADDRESS + ":")
    healed = next(line for line in network["link_log"] if "healed" in line)
    counts = json.loads(healed.split("so far ", 1)[1])
    assert counts["lost"] > 0 and counts["partitioned"] > 0 and counts["delivered"] > 100
    cut = next(f for f in record["faults"] if f["kind"] == "partition")
    times = sorted(record["sent"][i]["sent_at"] for i, _ in record["deliveries"]["sub-03"]
                   if i in record["sent"])
    assert any(t < cut["started"] for t in times) and any(t > cut["ended"] for t in times)
