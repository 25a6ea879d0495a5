"""Pure parts of the key server: epochs, rate limits, sealing, certificates, metrics."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.threshold_lab import local_deployment
from ibe_pubsub.keyserver.api_models import MAX_CREDENTIALS, MAX_FINE_CREDENTIALS
from ibe_pubsub.keyserver.enrolment import labels
from ibe_pubsub.keyserver.epochs import EpochClock
from ibe_pubsub.keyserver.keystore import b64
from ibe_pubsub.keyserver.metrics import Metrics
from ibe_pubsub.keyserver.ratelimit import RateLimiter
from ibe_pubsub.keyserver.sealing import UnsealError, seal_secret, unseal_secret
from ibe_pubsub.keyserver.threshold_client import MAX_ANSWER_BYTES, MAX_KEYS, max_answer_bytes


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


def test_the_largest_honest_subscriber_answer_fits_a_threshold_clients_cap():
    """The most one enrolment issues (MAX_CREDENTIALS credentials of the attribute with the
    largest connection requests, each with its request, and MAX_FINE_CREDENTIALS fine tokens
    of the longest paths of 4-byte characters) answered as a member answers it: its key
    count passes the client's check and its JSON fits max_answer_bytes."""
    group = load_group()
    tpk, secrets = local_deployment(group, 2, 3, b"answer cap")
    schema = default_schema()
    pp = S.PublicParams(group, tpk.mpk, schema)
    numeric = max((a for a in schema.attributes if a.kind == "num"), key=lambda a: a.positions)
    text = max((a for a in schema.attributes if a.kind == "str"), key=lambda a: a.positions)
    bits = numeric.positions - 1
    credentials = [Credential(numeric.name, "num", format(i, f"0{bits}b"))
                   for i in range(MAX_CREDENTIALS)]
    glyphs = [chr(0x1F600 + k) for k in range(64)]
    fine = [Credential(text.name, "str", "".join(glyphs[(i >> (6 * k)) % 64]
                                                 for k in range(text.positions - 1)))
            for i in range(MAX_FINE_CREDENTIALS)]
    epoch, expires_at, seed = 7, 2**40, bytes(32)
    binding = group.exp_secret(tpk.mpk.g_hat, 5)
    share = T.keyshare_subscriber(pp, tpk, secrets[1], "alice", epoch, credentials, fine)
    signed = [T.partial_sign_request(pp, secrets[1], "alice", c, epoch, expires_at, seed,
                                     binding) for c in credentials]
    answer = {"index": 1, "identity": "alice", "epoch": epoch, "epoch_end": 1e12,
              "expires_at": expires_at, "credentials": labels(credentials),
              "fine_credentials": labels(fine), "share": b64(T.encode_subscriber_share(share)),
              "request_signatures": [
                  {"attribute": c.attribute, "credential": c.label(), "request": b64(body),
                   "signature": b64(T.encode_partial_signature(partial))}
                  for c, (body, partial) in zip(credentials, signed, strict=True)]}
    size = len(json.dumps(answer, ensure_ascii=False).encode())
    assert MAX_ANSWER_BYTES < size <= max_answer_bytes(schema), (size, max_answer_bytes(schema))
    assert len(credentials) + len(fine) <= MAX_KEYS
