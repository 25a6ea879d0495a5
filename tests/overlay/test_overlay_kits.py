"""The virtual-peer plan is one rule for both sides: a peer plans from the credentials and
fine credentials the key server issues (fine ones for every credential), the simulator's
issuers from what they make themselves (fine ones for the virtual peers only); both must
give every subscriber the same virtual peers with the same fine tokens."""

import pytest

from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.keyserver.enrolment import plan_subscriber
from ibe_pubsub.overlay.issuer import ModeledIssuer
from ibe_pubsub.overlay.kits import plan_virtual_peers

SCHEMA = default_schema()
EPOCH = 3


@pytest.mark.parametrize("subscription", [
    'symbol prefix "IB" and price in [10, 20]',
    "price < 50",
    "",  # constrains nothing: the first attribute's whole-domain credential joins
])
def test_the_key_servers_credentials_plan_the_simulators_virtual_peers(subscription: str):
    predicate = parse_predicate(SCHEMA, subscription)
    creds, fine = plan_subscriber(SCHEMA, predicate, 4, 1)
    plan = plan_virtual_peers(SCHEMA, creds, fine)
    issuer = ModeledIssuer(SCHEMA)
    kit = issuer.subscriber_kit(predicate, EPOCH, 2**40, 4, 1)
    assert [v.credential for v in kit.virtuals] == [c for c, _ in plan]
    token = issuer.crypto.make_token
    assert [v.fine_tokens for v in kit.virtuals] == [
        tuple(token(f, EPOCH) for f in fines) for _, fines in plan]
    # Control: the key server also issues fine credentials that no virtual peer covers
    # (those of whole-domain credentials), which the plan must leave out.
    assert sum(len(fines) for _, fines in plan) < len(fine)
    # ... and the fine tokens compared are not all empty where a subscription has them
    assert any(fines for _, fines in plan) == bool(subscription)
