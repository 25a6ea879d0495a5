"""The oracle of ``bench soak``: from what the publishers sent, what each subscriber
delivered and when each process ran, decide what was owed, what was lost, and whether
anything else went wrong.

Owed: an event is owed to a subscriber when its predicate matches the event's values and
the event was sent while one of the subscriber's processes was attached and settled: from
``JOIN_SETTLE`` seconds after it was ready until ``IN_FLIGHT`` seconds before it was
killed (or the run ended), outside the times it was stopped (from ``IN_FLIGHT`` before
SIGSTOP to ``JOIN_SETTLE`` after SIGCONT). Events of the revoked publisher sent after the
revocation are owed to nobody.

Fault windows: each fault may make *other* subscribers miss events for a while (the
children of a killed peer, every subscriber of a killed root's tree). A window is declared
per fault, from ``IN_FLIGHT`` seconds before its start (the events in flight when it
strikes) to a bound its kind allows (:func:`fault_windows`); a miss inside
one is counted under the kind of the latest fault that began before it, a miss outside
every window is *lost*. A window excuses only the subscribers its fault could cut off:
a killed or stopped subscriber's own misses and those of every subscriber it was above
in a tree when it struck (:mod:`evaluation.soak_trees` rebuilds the trees from the
peers' logs), the namespace group's and those below it for a partition, everyone for a
root or the key server. With a subscriber killed every 20 s the windows together cover
most of a run (``window_coverage``), so this scoping is what makes "lost" mean something.
The time each fault really needed ("settled") is measured: from the fault to the last
missed event attributed to it (0 when nothing was missed).

Also checked: no event delivered twice to a subscriber (over all its processes), none
delivered that its predicate does not match, nothing of the revoked publisher delivered
after its last epoch plus the grace window, no process ended but those the schedule
killed, every enrolment and refusal a process saw in the key server's audit log once, and
no answer of the key server with a 5xx status. Reported besides, not failing a run:
whether resident memory and held descriptors (all but established TCP connections)
stayed flat after warm-up.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ibe_pubsub.credentials import default_schema, parse_predicate
from ibe_pubsub.evaluation.plots import figure
from ibe_pubsub.evaluation.soak_trees import Trees

#: An event sent this long before a subscriber was killed or stopped may still have been in
#: flight: not owed.
IN_FLIGHT = 2.0
#: A subscriber is owed events sent this long after its process was ready.
JOIN_SETTLE = 3.0
#: How far past the fault's own end (restart, SIGCONT) each kind may make others miss:
#: the failure timeout, then a rejoin or a repair.
WINDOW_SLACK = 10.0
#: The share of the run before memory and descriptors must be flat, and the growth allowed.
WARM_UP_SHARE = 1 / 3
FLAT_GROWTH = 0.10
ENROL_ROUTES = ("subscriber", "publisher", "root", "transport")
#: Exit statuses of a clean stop on SIGTERM: peers exit 0; the key server's uvicorn shuts
#: down, then re-raises the signal it caught.
_CLEAN = {False: (0,), True: (0, -15)}


def fault_windows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The declared window of every fault (seconds into the run), from ``IN_FLIGHT``
    before it: a subscriber's kill or stop, and a partition, until the failure timeout
    plus ``WINDOW_SLACK`` after it ended (the restart, SIGCONT or heal: the peers around
    it notice and find other parents, however long a restarted one takes to be ready); a
    root or the key server, until ``WINDOW_SLACK`` after it was ready again. A revocation
    makes nobody miss anything: no window."""
    timeout = record["settings"]["failure_timeout"]
    started = record["started"]
    out = []
    for fault in record["faults"]:
        if fault["kind"] == "revocation":
            continue
        around = fault["kind"].startswith(("subscriber_", "partition"))
        back = (fault.get("ended", fault["started"]) if around
                else fault.get("ready", fault.get("ended", fault["started"]))) - started
        slack = WINDOW_SLACK + (timeout if around else 0.0)
        out.append({"kind": fault["kind"], "target": fault["target"],
                    "at": round(fault["started"] - started, 3),
                    "from": round(fault["started"] - started - IN_FLIGHT, 3),
                    "to": round(back + slack, 3)})
    return out


#: Faults that can make any subscriber miss events.
EVERYONE = ("root_kill", "keyserver_kill")


def _reach(record: dict[str, Any]) -> Callable[[dict[str, Any], str], bool]:
    """Whether a fault window excuses a given subscriber's misses (see the module
    docstring); the ancestors at each fault are computed once."""
    trees = Trees(record["links"], {i["address"]: i["name"] for i in record["incarnations"]
                                    if i.get("address")})
    group = set(record.get("network", {}).get("group", ()))
    started = record["started"]
    cache: dict[tuple[str, float], set[str]] = {}

    def reaches(window: dict[str, Any], name: str) -> bool:
        if window["kind"] in EVERYONE:
            return True
        key = (name, window["at"])
        if key not in cache:
            cache[key] = trees.ancestors(name, started + window["at"]) | {name}
        cut = group if window["kind"] == "partition" else {window["target"]}
        return bool(cut & cache[key])

    return reaches


def _coverage(windows: list[dict[str, Any]], total: float) -> float:
    """The share of the run ``[0, total]`` inside at least one window."""
    covered, reach = 0.0, 0.0
    for w in sorted(windows, key=lambda w: w["from"]):
        start, end = max(w["from"], reach, 0.0), min(w["to"], total)
        if end > start:
            covered += end - start
        reach = max(reach, min(w["to"], total))
    return round(covered / total, 4) if total > 0 else 0.0


def attached(incarnations: list[dict[str, Any]], t: float) -> bool:
    """Was a process of this subscriber attached and settled when an event was sent at
    wall-clock time ``t``?"""
    for i in incarnations:
        if i["ready"] is None or not i["ready"] + JOIN_SETTLE <= t <= i["ended"] - IN_FLIGHT:
            continue
        return not any(a - IN_FLIGHT <= t <= b + JOIN_SETTLE for a, b in i["paused"])
    return False


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {"count": len(values), "median": round(statistics.median(ordered), 3),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
            "max": round(ordered[-1], 3)}


def _revocation_bound(record: dict[str, Any]) -> float | None:
    """Wall-clock time after which nothing of the revoked publisher may be delivered: the
    end of the last epoch it could hold keys of (the next one if revoked in a grace
    window), plus the grace window."""
    epoch = record.get("revoked_epoch")
    if not epoch:
        return None
    grace = record["settings"]["grace_seconds"]
    last_end = epoch["epoch_end"] + (record["settings"]["epoch_seconds"]
                                     if epoch["in_grace"] else 0)
    return last_end + grace


def _held(sample: dict[str, Any], name: str) -> int:
    """Descriptors a process holds besides its established connections (a record from
    before connections were sampled counts them all)."""
    return sample["fds"][name] - sample.get("connections", {}).get(name, 0)


def flatness(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Growth of resident memory and of held descriptors (all but the established
    connections, whose number follows the trees' shape) of every process that ran through
    the run's last two thirds without a restart: the median of the last fifth of its
    samples against the median of the first fifth after warm-up. Total descriptors are
    reported beside them."""
    started, total = record["started"], record["settings"]["minutes"] * 60
    warm = total * WARM_UP_SHARE
    out = []
    for inc in record["incarnations"]:
        # Its own warm-up too, for a process restarted before the run's ended.
        begin = max(inc["started"] - started + warm / 2, warm)
        end = (inc["ended"] - started) if inc["ended"] else total
        if inc["started"] - started > warm or end < total - 1:
            continue
        name = inc["name"]
        series = [(s["rss_mib"][name], _held(s, name), s["fds"][name])
                  for s in record["samples"]
                  if begin <= s["t"] <= end and name in s["rss_mib"]]
        if len(series) < 10:
            continue
        fifth = max(2, len(series) // 5)
        row: dict[str, Any] = {"name": name, "role": inc["role"]}
        for k, key in enumerate(("rss", "held_fds", "fds")):
            first = statistics.median(v[k] for v in series[:fifth])
            last = statistics.median(v[k] for v in series[-fifth:])
            row[f"{key}_first"], row[f"{key}_last"] = first, last
            row[f"{key}_growth"] = round(last / first - 1, 4) if first else 0.0
        row["flat"] = (row["rss_growth"] < FLAT_GROWTH
                       and row["held_fds_growth"] < FLAT_GROWTH)
        out.append(row)
    return out


def _audit_check(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per identity and enrolment route, the answers its processes saw against the key
    server's audit entries: an issuance per 200, a refusal entry per 4xx."""
    server: dict[str, Counter[str]] = defaultdict(Counter)
    for entry in record["audit"]:
        action, detail = entry["action"], entry.get("detail") or {}
        if action.startswith("issue_") and action[6:] in ENROL_ROUTES:
            server[entry["actor"]][f"{action[6:]} 200"] += 1
        elif action == "refuse" and str(detail.get("route", "")).startswith("/v1/enrol/"):
            route = detail["route"].rsplit("/", 1)[-1]
            server[entry["actor"]][f"{route} {detail.get('status')}"] += int(
                detail.get("count", 1))
    # An enrolment in flight when its process ended (killed, or stopped at the end of the
    # run) or when the key server was killed is issued and logged, its answer never seen:
    # one per such moment of an identity, over all its routes (a process enrols one
    # request at a time).
    server_kills = [f["started"] for f in record["faults"] if f["kind"] == "keyserver_kill"]
    cut_off: Counter[str] = Counter()
    for inc in record["incarnations"]:
        cut_off[inc["name"]] += int(inc["end"] in ("killed", "stopped"))
        cut_off[inc["name"]] += sum(1 for t in server_kills if inc["started"] <= t
                                    and (inc["ended"] is None or t <= inc["ended"]))
    # Behind the lossy link an answer can be lost after the server logged it (the client
    # asks again): there, only answers seen but not logged count.
    behind_link = set(record.get("network", {}).get("group", ()))
    mismatches = []
    for name, seen in record["client_answers"].items():
        keys = sorted(set(seen) | set(server.get(name, {})))
        extras = {key: server[name][key] - seen.get(key, 0) for key in keys}
        unseen = sum(extra for extra in extras.values() if extra > 0)
        for key, extra in extras.items():
            if extra < 0 or (extra > 0 and unseen > cut_off[name]
                             and name not in behind_link):
                mismatches.append({"identity": name, "answer": key,
                                   "seen_by_clients": seen.get(key, 0),
                                   "in_audit_log": server[name][key]})
    return mismatches


def _crashed(incarnation: dict[str, Any], record: dict[str, Any]) -> bool:
    """Did a process end other than as told? Killed by the schedule, or stopped at the end
    with a clean status, is as told; so is the revoked publisher ending after the
    revocation, whatever its status (it is refused new keys)."""
    if incarnation["end"] == "killed":
        return False
    if (incarnation["name"] == record["revoked_publisher"] and record.get("revoked_at")
            and incarnation["ended"] >= record["revoked_at"]):
        return False
    return not (incarnation["end"] == "stopped" and incarnation["returncode"] in _CLEAN[
        incarnation["role"] == "keyserver"])


def analyse(record: dict[str, Any], leftovers: Iterable[int] = ()) -> dict[str, Any]:
    """The oracle's verdict on one run (see the module docstring)."""
    schema = default_schema()
    started = record["started"]
    incarnations: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for inc in record["incarnations"]:
        incarnations[inc["name"]].append(inc)
    windows = fault_windows(record)
    reaches = _reach(record)
    revoked_at = record.get("revoked_at")
    bound = _revocation_bound(record)
    sent = record["sent"]
    minutes = int(record["settings"]["minutes"]) + 1
    timeline = [Counter() for _ in range(minutes + 1)]
    for e in sent.values():
        timeline[min(minutes, int((e["sent_at"] - started) // 60))]["published"] += 1

    lost: list[dict[str, Any]] = []
    excused: Counter[str] = Counter()
    duplicates, wrong, late_revoked = [], [], []
    misses_at: list[tuple[float, str, str]] = []
    owed_total = delivered_total = 0
    for name, text in record["subscriptions"].items():
        predicate = parse_predicate(schema, text)
        got = Counter(event_id for event_id, _ in record["deliveries"][name])
        for event_id, count in got.items():
            event = sent.get(event_id)
            if count > 1:
                duplicates.append({"subscriber": name, "event": event_id, "count": count})
            if event is not None and not predicate.matches(event["values"]):
                wrong.append({"subscriber": name, "event": event_id})
        if bound is not None:
            late_revoked += [{"subscriber": name, "event": i, "delivered_at": at}
                             for i, at in record["deliveries"][name]
                             if sent.get(i, {}).get("publisher") == record["revoked_publisher"]
                             and at is not None and at > bound]
        for event_id, event in sent.items():
            t = event["sent_at"]
            if (event["publisher"] == record["revoked_publisher"] and revoked_at is not None
                    and t >= revoked_at):
                continue
            if not predicate.matches(event["values"]) or not attached(incarnations[name], t):
                continue
            owed_total += 1
            minute = timeline[min(minutes, int((t - started) // 60))]
            minute["owed"] += 1
            if got[event_id]:
                delivered_total += 1
                minute["delivered"] += 1
                continue
            minute["missed"] += 1
            elapsed = t - started
            misses_at.append((elapsed, name, event_id))
            inside = [w for w in windows if w["from"] <= elapsed <= w["to"]
                      and reaches(w, name)]
            if inside:  # counted against the latest window opened before it
                excused[max(inside, key=lambda w: w["from"])["kind"]] += 1
            else:
                lost.append({"subscriber": name, "event": event_id,
                             "sent_s": round(elapsed, 3)})
    for d in duplicates:
        event = sent.get(d["event"])
        if event is not None:
            timeline[min(minutes, int((event["sent_at"] - started) // 60))]["duplicates"] += 1

    # Settled: from each fault to the last miss sent before the next fault began.
    settled: dict[str, list[float]] = defaultdict(list)
    starts = sorted((w["at"], w["kind"]) for w in windows)
    for k, (at, kind) in enumerate(starts):
        until = starts[k + 1][0] if k + 1 < len(starts) else float("inf")
        inside = [t for t, _, _ in misses_at if at <= t < until]
        settled[kind].append(round(max(inside) - at, 3) if inside else 0.0)
    rejoin = [f["ready"] - f["ended"] for f in record["faults"]
              if f["kind"] in ("subscriber_kill", "root_kill") and "ready" in f]

    crashed = [{"name": i["name"], "returncode": i["returncode"], "ended_s":
                round(i["ended"] - started, 3)}
               for i in record["incarnations"] if _crashed(i, record)]
    flat = flatness(record)
    audit = _audit_check(record)
    per_minute = []
    for m, counts in enumerate(timeline):
        samples = [s for s in record["samples"] if m * 60 <= s["t"] < (m + 1) * 60]
        per_minute.append({"minute": m, **{k: counts.get(k, 0) for k in (
            "published", "owed", "delivered", "missed", "duplicates")},
            "rss_mib": samples[-1]["rss_mib"] if samples else {},
            "fds": samples[-1]["fds"] if samples else {},
            "held_fds": {name: _held(samples[-1], name) for name in samples[-1]["fds"]}
            if samples else {},
            "faults": [w["kind"] for w in windows if m * 60 <= w["from"] < (m + 1) * 60]})
    end = started + record["settings"]["minutes"] * 60
    publishers = {name: {"fed": fed,
                         "sent": sum(1 for e in sent.values() if e["publisher"] == name),
                         "sent_after_the_run": sum(1 for e in sent.values()
                                                   if e["publisher"] == name
                                                   and e["sent_at"] > end)}
                  for name, fed in record.get("fed", {}).items()}
    return {
        "publishers": publishers,
        "owed": owed_total, "delivered": delivered_total, "lost": len(lost),
        "lost_examples": lost[:20], "missed_in_fault_windows": dict(excused),
        "duplicates": len(duplicates), "duplicate_examples": duplicates[:20],
        "wrong_deliveries": len(wrong), "wrong_examples": wrong[:20],
        "revoked_after_grace": len(late_revoked), "revocation_bound": bound,
        "revoked_delivered_after_revocation": sum(
            1 for name in record["subscriptions"] for i, _ in record["deliveries"][name]
            if sent.get(i, {}).get("publisher") == record["revoked_publisher"]
            and revoked_at is not None and sent[i]["sent_at"] >= revoked_at),
        "crashed": crashed, "left_running": list(leftovers),
        "server_errors": record.get("server_errors", {}),
        # The namespace group's link emulator was still running at the end (a dead one
        # would have cut the group off for good, silently).
        "link_emulator_died": not record.get("network", {}).get("emulator_running", True),
        "flatness": flat, "all_flat": all(r["flat"] for r in flat),
        "audit_mismatches": audit,
        "fault_windows": windows,
        "window_coverage": _coverage(windows, record["settings"]["minutes"] * 60),
        "settled_s": {k: _summary(v) for k, v in settled.items()},
        "restart_to_ready_s": _summary(rejoin),
        "faults_by_kind": dict(Counter(f["kind"] for f in record["faults"])),
        "timeline": per_minute,
    }


def passed(verdict: dict[str, Any]) -> bool:
    """Nothing lost outside the fault windows, no duplicate, no wrong or late delivery, no
    crash, nothing left running, every answer in the audit log, no 5xx answer."""
    return not (verdict["lost"] or verdict["duplicates"] or verdict["wrong_deliveries"]
                or verdict["revoked_after_grace"] or verdict["crashed"]
                or verdict["left_running"] or verdict["audit_mismatches"]
                or verdict["server_errors"] or verdict["link_emulator_died"])


def plot_soak(report: dict[str, Any], path: Any) -> None:
    """Per minute: events owed, delivered, missed and duplicated, with the faults; the
    resident memory and the descriptors of every process followed for flatness."""
    verdict = report["verdict"]
    rows = verdict["timeline"]
    minutes = [r["minute"] for r in rows]
    followed = [r["name"] for r in verdict["flatness"]] or sorted(
        {n for r in rows for n in r["rss_mib"]})[:8]
    panels = [("events per minute (by minute sent)", "events"),
              ("resident memory (MiB)", "rss"),
              ("descriptors held (besides established connections)", "fds")]
    title = (f"Soak: {report['settings']['minutes']:g} min, "
             f"{report['settings']['subscribers']} subscribers, seed "
             f"{report['settings']['seed']}: {verdict['lost']} lost, "
             f"{verdict['duplicates']} duplicates")
    with figure(path, title, "minute of the run", panels) as axes:
        (events, _), (rss, _), (fds, _) = axes
        for key, style in (("owed", "-"), ("delivered", "--"), ("missed", ":"),
                           ("duplicates", "-.")):
            events.plot(minutes, [r[key] for r in rows], style, marker=".", label=key)
        colours = {"subscriber_kill": "grey", "subscriber_stop": "orange",
                   "root_kill": "red", "keyserver_kill": "purple"}
        shown: set[str] = set()
        for window in verdict["fault_windows"]:
            kind = window["kind"]
            events.axvline(window["from"] / 60, color=colours.get(kind, "black"),
                           linewidth=0.6, alpha=0.6, label=None if kind in shown else kind)
            shown.add(kind)
        for name in followed:
            points = [(r["minute"], r["rss_mib"][name], r["held_fds"][name]) for r in rows
                      if name in r["rss_mib"]]
            rss.plot([p[0] for p in points], [p[1] for p in points], label=name)
            fds.plot([p[0] for p in points], [p[2] for p in points], label=name)
