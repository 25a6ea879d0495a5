"""Attacks on a real key server: keys must not reach outside the identity's policy.

``max_credentials`` coarsening and cells that straddle a policy bound used to widen the
issued credentials beyond the policy (a subscriber limited to ``price in [100, 200]``
got ``price:00`` = [0, 250) and decrypted a price 50 event; a publisher limited to
``price <= 300`` got ``price:0`` = [0, 500) and signed a price 450 event). Each probe
here runs with real keys, and a control shows the same probe works where the policy
allows it, so the tests cannot pass for want of an effective probe.
"""

from __future__ import annotations

import uuid

import pytest

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.numeric import value_bits
from ibe_pubsub.credentials.scheme import (
    DecryptionError,
    EncryptedEvent,
    Event,
    NotAuthorized,
    decrypt,
    encrypt_and_sign,
    verify,
)
from ibe_pubsub.keyserver.bundles import (
    ServerParams,
    decode_params,
    decode_publisher_bundle,
    decode_subscriber_bundle,
)
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError

CELL = 1000 / 2**16  # width of a price cell in the default schema
OTHERS = {"symbol": "IBM", "volume": 500}


class Probe:
    """Identities on one key server, and events signed with unrestricted publisher keys."""

    def __init__(self, ks) -> None:
        self.ks = ks
        self.admin = KeyServerClient(ks.base_url, ks.admin_token, retries=0)
        self.group = load_group()
        self.params: ServerParams = decode_params(self.group,
                                                  KeyServerClient(ks.base_url).params())
        self.publisher_keys = self.publisher(None).enrol_publisher("")

    def identity(self, role: str, policy: str | None) -> KeyServerClient:
        created = self.admin.create_identity(f"{role}-{uuid.uuid4().hex[:10]}", role, policy)
        return KeyServerClient(self.ks.base_url, created["token"], retries=0)

    def publisher(self, policy: str | None) -> KeyServerClient:
        return self.identity("publisher", policy)

    def event(self, price: float, keys=None) -> EncryptedEvent:
        keys = keys or decode_publisher_bundle(self.group, self.publisher_keys).keys
        return encrypt_and_sign(self.params.pp, keys,
                                Event(f"e-{price}", {**OTHERS, "price": price}, b"secret"))

    def opens(self, bundle: dict, event: EncryptedEvent) -> bool:
        key = decode_subscriber_bundle(self.group, bundle).key
        try:
            return decrypt(self.params.pp, key, event).body == b"secret"
        except DecryptionError:
            return False

    def signs(self, bundle: dict, price: float) -> bool:
        """True iff the publisher keys of ``bundle`` make a price event that verifies."""
        keys = decode_publisher_bundle(self.group, bundle).keys
        try:
            return verify(self.params.pp, self.event(price, keys))
        except NotAuthorized:
            return False


@pytest.fixture
def probe(keyserver) -> Probe:
    return Probe(keyserver)


def _enrol(call) -> dict | None:
    """The bundle, or None after checking the refusal is a clear 403 outside_policy."""
    try:
        return call()
    except KeyServerRequestError as exc:
        error = exc.body["error"]
        assert (exc.status, error["code"]) == (403, "outside_policy"), exc.body
        assert error["message"] and error["detail"]["clause"], exc.body
        return None


def _price_cells(bundle: dict, key: str = "credentials") -> list[tuple[float, float]]:
    """The [start, end) price interval of each price credential of a bundle."""
    out = []
    for label in bundle[key].get("price", []):
        path = Credential.from_label(label).path
        width = CELL * 2 ** (16 - len(path))
        start = (int(path, 2) if path else 0) * width
        out.append((start, start + width))
    return out


def test_subscriber_cap_cannot_widen_the_policy(probe):
    low, mid = probe.event(50.0), probe.event(150.0)
    subscriber = probe.identity("subscriber", "price in [100, 200]")
    outcomes = {}
    for cap in (1, 5, 13, None):
        bundle = _enrol(lambda cap=cap: subscriber.enrol_subscriber(
            "price in [100, 200]", max_credentials=cap))
        outcomes[cap] = "403" if bundle is None else "served"
        if bundle is None:
            continue
        cells = _price_cells(bundle) + _price_cells(bundle, "fine_credentials")
        assert all(start >= 100 and end <= 200 for start, end in cells), cells
        assert not probe.opens(bundle, low)
        assert probe.opens(bundle, mid)  # the served keys do work inside the policy
    print(f"price in [100, 200] by max_credentials: {outcomes}")
    # a cap the policy's region cannot meet gives way to the fewest blocks inside it
    assert set(outcomes.values()) == {"served"}
    fewest = subscriber.enrol_subscriber("price in [100, 200]", max_credentials=1)
    assert len(fewest["credentials"]["price"]) > 1
    # control: where the policy allows price 50, the same cap-1 request gets price:00
    # (what the attacker used to get) and it decrypts the same event
    allowed = probe.identity("subscriber", "price in [0, 250]")
    bundle = allowed.enrol_subscriber("price in [0, 250]", max_credentials=1)
    assert bundle["credentials"]["price"] == ["price:00"]
    assert probe.opens(bundle, low)


def test_publisher_cap_cannot_widen_the_policy(probe):
    publisher = probe.publisher("price <= 300")
    outcomes = {}
    for advertisement, cap in (("price <= 300", 1), ("price <= 300", 2),
                               ("price <= 300", None), ("price in [250, 300]", 1)):
        bundle = _enrol(lambda a=advertisement, c=cap: publisher.enrol_publisher(a, c))
        outcomes[f"{advertisement} / {cap}"] = "403" if bundle is None else "served"
        if bundle is None:
            continue
        assert all(end <= 300 for _, end in _price_cells(bundle))
        assert not probe.signs(bundle, 450.0)
        assert probe.signs(bundle, 100.0) or advertisement.startswith("price in")
    print(f"publisher price <= 300: {outcomes}")
    assert set(outcomes.values()) == {"served"}  # the caps gave way, inside the policy
    # control: a publisher whose policy allows 450 gets price:0 with cap 1 and its event verifies
    wide = probe.publisher("price <= 500").enrol_publisher("price <= 500", 1)
    assert wide["credentials"]["price"] == ["price:0"]
    assert probe.signs(wide, 450.0)


def test_edge_cells_straddling_a_policy_bound_are_not_issued(probe):
    """100 and 300 are not cell boundaries: the cells holding them are half outside."""
    below = 99.995  # in the cell holding 100, outside [100, 200]
    inside = 100.02  # in the first cell entirely inside
    price = probe.params.pp.schema.attribute("price")
    assert value_bits(price, below) == value_bits(price, 100.0)
    edge, first = probe.event(below), probe.event(inside)
    bounded = probe.identity("subscriber", "price in [100, 200]")
    bundle = bounded.enrol_subscriber("price in [100, 200]")
    assert not probe.opens(bundle, edge)
    assert probe.opens(bundle, first)
    # control: the same request without a policy covers the edge cell and opens the event
    free = probe.identity("subscriber", None).enrol_subscriber("price in [100, 200]")
    assert probe.opens(free, edge)
    # publishers: the cell holding 300 is not issued either, so 300.003 cannot be signed
    above = 300.003
    assert value_bits(price, above) == value_bits(price, 300.0)
    keys = probe.publisher("price <= 300").enrol_publisher("price <= 300")
    assert not probe.signs(keys, above) and probe.signs(keys, 299.9)
    assert probe.signs(probe.publisher(None).enrol_publisher("price <= 300"), above)


def _item(identity: str, labels: list[tuple[str, bool]]) -> dict:
    creds = []
    for label, fine in labels:
        cred = Credential.from_label(label)
        creds.append({"attribute": cred.attribute, "credential": label, "fine": fine,
                      "position": cred.position})
    return {"identity": identity, "role": "subscriber", "credentials": creds}


def test_bulk_items_outside_the_stored_policy_get_an_error(probe):
    name = f"bulk-pol-{uuid.uuid4().hex[:10]}"
    probe.admin.create_identity(name, "subscriber", "price in [100, 200]")
    inside = "price:" + value_bits(probe.params.pp.schema.attribute("price"), 150.0)[:8]
    base = [('symbol:""', False), ("volume:*", False)]
    items = [_item(name, [*base, ("price:00", False)]),               # [0, 250): outside
             _item(name, [*base, (inside, False), ("price:00", True)]),  # a fine one outside
             _item(name, [*base, (inside, False), (inside + "0", True)]),
             _item(f"{name}-new", [*base, ("price:00", False)])]   # created: no policy
    start = max((e["id"] for e in probe.admin.audit(limit=1000)), default=0)
    out = probe.admin.bulk(f"chunk-{name}", items)
    errors = [b.get("error") for b in out["bundles"]]
    print(f"bulk errors: {errors}")
    assert "price:00" in errors[0] and "policy" in errors[0] and "price in [100.0" in errors[0]
    assert "price:00" in errors[1] and "subscriber_key" not in out["bundles"][1]
    assert errors[2] is None and errors[3] is None
    assert probe.opens(out["bundles"][2], probe.event(150.0))
    assert probe.opens(out["bundles"][3], probe.event(50.0))  # the probe event is effective
    issued = [e["detail"]["identity"] for e in probe.admin.audit(after=start, limit=1000)
              if e["action"] == "issue_bulk" and e["detail"].get("chunk_id") == f"chunk-{name}"]
    assert sorted(issued) == sorted([name, f"{name}-new"])
