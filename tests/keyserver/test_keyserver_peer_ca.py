"""The key server as the peer-link CA (real uvicorn server over HTTP).

The CA's certificate comes with the public parameters, signed by the server key, and is the
same after a restart (its key is derived from the master secret, no file holds it). Each
check of a signature or chain here is done with ``cryptography`` itself, and the decoding
functions peers use are shown to refuse what does not chain or certifies another key.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from datetime import UTC, datetime

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.certificates import fingerprint, peer_ca_message
from ibe_pubsub.credentials.peer_certificates import (
    PeerBinding,
    ca_certificate,
    issue_peer_certificate,
    read_peer_certificate,
    to_pem,
)
from ibe_pubsub.keyserver.bundles import BundleError, decode_params, decode_transport_certificate
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError

_count = iter(range(10**6))
DATA_FILES = {"admin.token", "database.json", "keyserver.db", "keyserver.db-shm",
              "keyserver.db-wal", "master.sealed", "public.json", "server.log"}


def _identity(server, role: str, policy: str | None = None) -> tuple[KeyServerClient, str]:
    name = f"ca-{role}-{next(_count)}"
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    return KeyServerClient(server.base_url, admin.create_identity(name, role, policy)["token"],
                           retries=0), name


def _key() -> tuple[Ed25519PrivateKey, bytes, str]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes_raw()
    return private, raw, base64.b64encode(raw).decode()


def _refused(call) -> KeyServerRequestError:
    with pytest.raises(KeyServerRequestError) as info:
        call()
    assert info.value.body["error"]["status"] == info.value.status
    return info.value


def _ca_signature_verifies(doc: dict) -> bool:
    """Straight from cryptography: the server key's signature over the CA's DER."""
    der = x509.load_pem_x509_certificate(doc["peer_ca"].encode()).public_bytes(
        serialization.Encoding.DER)
    server_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["server_key"]))
    try:
        server_key.verify(base64.b64decode(doc["peer_ca_signature"]), peer_ca_message(der))
    except InvalidSignature:
        return False
    return True


def test_params_carry_a_signed_ca_that_survives_a_restart(keyserver_factory):
    server = keyserver_factory.start(serve_args=("--workers", "1"))
    doc = KeyServerClient(server.base_url).params()
    assert _ca_signature_verifies(doc)
    ca = x509.load_pem_x509_certificate(doc["peer_ca"].encode())
    ca.verify_directly_issued_by(ca)  # self-signed
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # control: the same check fails for a signature over another CA
    other = to_pem(ca_certificate(Ed25519PrivateKey.generate()))
    assert not _ca_signature_verifies(dict(doc, peer_ca=other))

    restarted = keyserver_factory.restart(server, ("--workers", "1"))
    again = KeyServerClient(restarted.base_url).params()
    assert (again["peer_ca"], again["peer_ca_signature"]) == (
        doc["peer_ca"], doc["peer_ca_signature"])
    # no file holds the CA: key stores made before it keep working
    assert {p.name for p in server.data_dir.iterdir()} <= DATA_FILES
    assert "peer_ca" not in (server.data_dir / "public.json").read_text()


def test_decode_params_refuses_a_swapped_ca(keyserver):
    doc = KeyServerClient(keyserver.base_url).params()
    params = decode_params(load_group(), doc)  # control: the untouched document decodes
    assert params.peer_ca == doc["peer_ca"]
    other = to_pem(ca_certificate(Ed25519PrivateKey.generate()))
    with pytest.raises(BundleError, match="peer-link CA signature does not verify"):
        decode_params(load_group(), dict(doc, peer_ca=other))
    with pytest.raises(BundleError):
        decode_params(load_group(), dict(doc, peer_ca="not a certificate"))
    with pytest.raises(BundleError):
        decode_params(load_group(), {k: v for k, v in doc.items() if k != "peer_ca_signature"})


def test_issued_certificate_chains_binds_and_ends_with_the_epoch(keyserver):
    doc = KeyServerClient(keyserver.base_url).params()
    params = decode_params(load_group(), doc)
    ca = x509.load_pem_x509_certificate(doc["peer_ca"].encode())
    root, name = _identity(keyserver, "root", "price < 10")
    _, raw, b64 = _key()
    issued = root.enrol_transport(b64, ["127.0.0.1:40001", "[::1]:40001"])

    cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
    cert.verify_directly_issued_by(ca)  # chains to the CA, checked by cryptography alone
    assert cert.public_key().public_bytes_raw() == raw
    binding = read_peer_certificate(cert).binding
    schema = params.pp.schema.names
    assert binding == PeerBinding(name, "root", ("127.0.0.1:40001", "[::1]:40001"),
                                  tuple(a for a in schema if a != "price"), params.epoch)
    assert "price" in schema and "price" not in issued["attributes"]
    assert cert.not_valid_after_utc.timestamp() == int(params.epoch_end + params.grace)
    assert issued["not_after"] == cert.not_valid_after_utc.timestamp()
    assert cert.not_valid_before_utc.timestamp() <= time.time()
    assert (issued["identity"], issued["role"], issued["epoch"]) == (name, "root", params.epoch)

    decoded = decode_transport_certificate(issued, params, raw)
    assert decoded.certificate.binding == binding and decoded.pem == issued["certificate"]
    with pytest.raises(BundleError, match="another key"):
        decode_transport_certificate(issued, params, _key()[1])
    foreign = Ed25519PrivateKey.generate()
    forged = to_pem(issue_peer_certificate(foreign, Ed25519PublicKey.from_public_bytes(raw),
                                           binding, time.time(), time.time() + 60))
    with pytest.raises(BundleError, match="not issued by"):
        decode_transport_certificate({"certificate": forged}, params, raw)
    other_ca = dataclasses.replace(params, peer_ca=to_pem(ca_certificate(foreign)))
    with pytest.raises(BundleError, match="not issued by"):
        decode_transport_certificate(issued, other_ca, raw)

    subscriber, _ = _identity(keyserver, "subscriber")
    _, raw, b64 = _key()
    plain = decode_transport_certificate(subscriber.enrol_transport(b64, []), params, raw)
    assert (plain.certificate.binding.role, plain.certificate.binding.attributes,
            plain.certificate.binding.addresses) == ("subscriber", (), ())


@pytest.mark.parametrize(("addresses", "code"), [
    (["LOCALHOST:4000"], "non_canonical_address"),
    (["127.0.0.1:04000"], "non_canonical_address"),
    (["[0:0::1]:4000"], "non_canonical_address"),
    (["127.0.0.1:0"], "invalid_address"),
    (["::1:4000"], "invalid_address"),
    (["127.1:4000"], "invalid_address"),          # numeric spellings of 127.0.0.1
    (["2130706433:4000"], "invalid_address"),
    (["0x7f.0.0.1:4000"], "invalid_address"),
    (["0.0.0.0:4000"], "invalid_address"),        # "every interface": nobody can dial it
    (["[::]:4000"], "invalid_address"),
    (["[::ffff:0.0.0.0]:4000"], "invalid_address"),
    (["[::ffff:7f00:1]:4000"], "invalid_address"),  # a second spelling of 127.0.0.1:4000
    (["[fe80::1%eth0]:4000"], "invalid_address"),
    (["224.0.0.1:4000"], "invalid_address"),
    (["255.255.255.255:4000"], "invalid_address"),
    (["a.test:1", "a.test:1"], "duplicate_address"),
    ([f"h{i}.test:4000" for i in range(5)], "invalid"),
])
def test_bad_addresses_are_422(keyserver, addresses, code):
    client, _ = _identity(keyserver, "subscriber")
    _, _, b64 = _key()
    err = _refused(lambda: client.enrol_transport(b64, addresses))
    assert (err.status, err.code) == (422, code), err.body
    if code == "non_canonical_address":
        assert err.body["error"]["detail"]["canonical"] in err.body["error"]["message"]
    # control: canonical addresses from the same identity are certified
    assert client.enrol_transport(b64, [f"ok{next(_count)}.test:4000"])["addresses"]


def test_bad_keys_revoked_identities_and_early_next_epoch_are_refused(keyserver):
    client, name = _identity(keyserver, "publisher")
    for bad in ("AAAA", "not base64!", base64.b64encode(bytes(33)).decode()):
        assert _refused(lambda bad=bad: client.enrol_transport(bad, [])).code == "invalid_key"
    _, _, b64 = _key()
    err = _refused(lambda: client.enrol_transport(b64, [], epoch="next"))
    assert (err.status, err.code) == (409, "not_in_grace")
    assert client.enrol_transport(b64, [], epoch="current")["identity"] == name  # control
    admin = KeyServerClient(keyserver.base_url, keyserver.admin_token, retries=0)
    admin.revoke(next(i["id"] for i in admin.list_identities() if i["name"] == name))
    err = _refused(lambda: client.enrol_transport(b64, []))
    assert (err.status, err.code) == (403, "revoked")


def test_next_epoch_certificate_in_the_grace_window(keyserver_factory):
    server = keyserver_factory.start(init_args=("--epoch-seconds", "6", "--grace-seconds", "3"),
                                     serve_args=("--workers", "1"))
    client, _ = _identity(server, "subscriber")
    epoch = KeyServerClient(server.base_url).epoch()
    grace_from = epoch["epoch_end"] - epoch["grace"]
    if time.time() > grace_from - 0.1:  # in or past this grace window: the next one, whole
        grace_from += epoch["epoch_length"]
    time.sleep(max(0.0, grace_from - time.time()) + 0.2)
    epoch = KeyServerClient(server.base_url).epoch()
    assert epoch["in_grace"]
    issued = client.enrol_transport(_key()[2], ["127.0.0.1:40002"], epoch="next")
    binding = read_peer_certificate(
        x509.load_pem_x509_certificate(issued["certificate"].encode())).binding
    assert binding.epoch == issued["epoch"] == epoch["epoch"] + 1
    # the next epoch ends one length after this one; its certificate a grace after that
    assert issued["not_after"] == int(epoch["epoch_end"] + epoch["epoch_length"]
                                      + epoch["grace"])
    # a this-epoch certificate asked for afterwards does not shorten the ownership
    current = client.enrol_transport(_key()[2], ["127.0.0.1:40002"])
    assert current["not_after"] < issued["not_after"]
    other, _ = _identity(server, "subscriber")
    err = _refused(lambda: other.enrol_transport(_key()[2], ["127.0.0.1:40002"]))
    assert (err.code, err.body["error"]["detail"]["until"]) == ("address_taken",
                                                                issued["not_after"])
    until = datetime.fromtimestamp(issued["not_after"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"until {until} ({issued['not_after']:.0f} Unix time)" in err.body["error"]["message"]


def test_issuance_is_audited_metered_and_counted(keyserver_factory):
    server = keyserver_factory.start(serve_args=("--workers", "1", "--key-rate", "0.01",
                                                 "--key-burst", "2"))
    client, name = _identity(server, "subscriber")
    _, raw, b64 = _key()
    client.enrol_transport(b64, ["127.0.0.1:40003"])
    client.enrol_transport(b64, ["127.0.0.1:40003"])
    err = _refused(lambda: client.enrol_transport(b64, ["127.0.0.1:40003"]))
    assert err.status == 429  # one key each, against the key metering
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    issued = [e for e in admin.audit(limit=1000) if e["action"] == "issue_transport"]
    assert len(issued) == 2 and issued[0]["actor"] == name
    detail = issued[0]["detail"]
    assert detail["addresses"] == ["127.0.0.1:40003"] and detail["identity"] == name
    assert detail["key_fingerprint"] == fingerprint(raw)
    metrics = KeyServerClient(server.base_url).metrics()
    assert 'ibe_keyserver_keys_issued_total{kind="peer_certificate"} 2' in metrics
