"""Pure parts of the key server: epochs, rate limits, sealing, certificates, metrics."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ibe_pubsub.keyserver.epochs import EpochClock
from ibe_pubsub.keyserver.metrics import Metrics
from ibe_pubsub.keyserver.ratelimit import RateLimiter
from ibe_pubsub.keyserver.sealing import UnsealError, seal_secret, unseal_secret


def test_epochs_are_numbered_from_the_start_and_keep_numbering_when_rescheduled():
    clock = EpochClock.start(1000.0, 60, 10)
    assert clock.current(1000.0).number == 1
    e = clock.current(1130.0)
    assert (e.number, e.start, e.end) == (3, 1120.0, 1180.0)
    assert not e.in_grace(1169.9) and e.in_grace(1170.0)
    faster = clock.rescheduled(1130.0, 10, 2)
    assert faster.current(1130.0) == e  # the current epoch keeps its length
    assert faster.current(1185.0).number == 4 and faster.current(1185.0).end == 1190.0
    assert faster.current(1200.0).number == 6
    assert EpochClock.from_json(json.loads(json.dumps(faster.to_json()))) == faster
    assert faster.rescheduled(1300.0, 10, 2) is faster
    assert clock.rescheduled(1178.0, 10, 2, lead=5).segments[-1].first_epoch == 5  # not 4
    for length, grace in ((0, 0), (10, 10), (10, 6), (100, 99), (10, -1)):
        with pytest.raises(ValueError):
            EpochClock.start(0.0, length, grace)
    assert EpochClock.start(0.0, 10, 5).segments[0].grace == 5  # half the epoch is the most


def test_rate_limiter_allows_bursts_then_refills():
    limiter = RateLimiter(rate=2.0, burst=3)
    assert [limiter.acquire("a", now=0.0) for _ in range(3)] == [None] * 3
    assert limiter.acquire("a", now=0.0) == pytest.approx(0.5)
    assert limiter.acquire("b", now=0.0) is None  # keys are independent
    assert limiter.acquire("a", now=0.5) is None
    assert limiter.acquire("a", now=0.5) is not None


def test_sealing_round_trips_and_rejects_wrong_passphrase_and_tampering():
    sealed = seal_secret(b"master secret", "pass")
    assert b"master secret" not in sealed
    assert unseal_secret(sealed, "pass") == b"master secret"
    with pytest.raises(UnsealError, match="wrong passphrase"):
        unseal_secret(sealed, "Pass")
    doc = json.loads(sealed)
    doc["ciphertext"] = doc["ciphertext"][:-4] + "AAA="
    with pytest.raises(UnsealError):
        unseal_secret(json.dumps(doc).encode(), "pass")
    with pytest.raises(UnsealError):
        unseal_secret(b"not json", "pass")
    with pytest.raises(ValueError):
        seal_secret(b"x", "")


def test_metrics_render_prometheus_text():
    """The text parses with prometheus_client's own parser, under the metric names the
    hand-written exposition had; two servers in one process keep separate counts."""
    m, other = Metrics(), Metrics()
    m.observe_request("GET", "/v1/params", 200, 0.02)
    m.observe_request("GET", "/v1/params", 200, 3.0)
    m.keys_issued("publisher", 4)
    other.keys_issued("publisher", 1)

    def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(metrics.render())
                for s in family.samples}

    assert samples(other)[("ibe_keyserver_keys_issued_total", (("kind", "publisher"),))] == 1
    got = samples(m)
    assert got[("ibe_keyserver_requests_total", (("method", "GET"), ("route", "/v1/params"),
                                                     ("status", "200")))] == 2
    assert got[("ibe_keyserver_keys_issued_total", (("kind", "publisher"),))] == 4
    assert got[("ibe_keyserver_request_seconds_bucket",
                    (("le", "0.025"), ("route", "/v1/params")))] == 1
    assert got[("ibe_keyserver_request_seconds_bucket",
                    (("le", "+Inf"), ("route", "/v1/params")))] == 2
    assert got[("ibe_keyserver_request_seconds_count", (("route", "/v1/params"),))] == 2


def test_a_key_store_of_scheme_version_1_is_refused_with_what_to_do(tmp_path):
    """A sealed master secret written by a version-1 build (two scalars, format byte 1)
    does not load: the operator is told to run `keyserver init` again."""
    import msgpack

    from ibe_pubsub.credentials.codec import TAG_MSK
    from ibe_pubsub.credentials.schema import default_schema
    from ibe_pubsub.keyserver.keystore import (
        SEALED_FILE,
        KeyStoreError,
        create_keystore,
        load_keystore,
    )

    store, _ = create_keystore(tmp_path, default_schema(), "pass")
    v1_msk = bytes((TAG_MSK, 1)) + store.msk.alpha.to_bytes(32, "big") + store.msk.phi.to_bytes(
        32, "big")
    (tmp_path / SEALED_FILE).write_bytes(seal_secret(msgpack.packb(
        {"msk": v1_msk, "signing_key": store.signing_key_bytes()}), "pass"))
    with pytest.raises(KeyStoreError, match=r"format version 1 .*keyserver init"):
        load_keystore(tmp_path, "pass")
