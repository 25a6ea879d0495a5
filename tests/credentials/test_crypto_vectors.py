"""`ibe-pubsub crypto vectors`, checked by an independent implementation.

The vectors come from the real command (mcl underneath); every equation is re-checked here
with arkworks (py_arkworks_bls12381) for the group arithmetic and `cryptography`/hashlib
for the symmetric parts, reading nothing but the JSON file. That makes the file a usable
interoperability reference, and catches any drift between our encodings (points, GT,
identity strings, KDF inputs) and the standard ones. The listed rejected encodings are
also handed to the project's own decoder, which must refuse each.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from py_arkworks_bls12381 import GT, G1Point, G2Point, Scalar  # the `dev` extra

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.groups import GroupError, GroupKind

CLI = [sys.executable, "-m", "ibe_pubsub.cli"]
SEED = "7"
# The scheme's constants, restated from the specification rather than imported.
DST_ID = b"IBE-PUBSUB-V2-ID"
DST_MSG = b"IBE-PUBSUB-V2-MSG"
KDF_PREFIX = b"IBE-PUBSUB-V2/"
TAG_DIGEST, FORMAT_VERSION = 12, 2
NONCE_BYTES, SW_BYTES = 12, 32
P = int("1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9fe"
        "ffffffffaaab", 16)
Q = int("73eda753299d7d483339d80809a1d80553bda402fffe5bfeffffffff00000001", 16)


def run_vectors(out: Path, seed: str, cwd: Path) -> bytes:
    """The real command, without configuration that could leak in from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IBE_PUBSUB_")}
    result = subprocess.run([*CLI, "crypto", "vectors", "--out", str(out), "--seed", seed],
                            capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert result.returncode == 0, result.stderr
    return (out / "vectors.json").read_bytes()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes, bytes]:
    base = tmp_path_factory.mktemp("vectors")
    return (run_vectors(base / "a", SEED, base), run_vectors(base / "b", SEED, base),
            run_vectors(base / "c", "8", base))


@pytest.fixture(scope="module")
def v(runs: tuple[bytes, bytes, bytes]) -> dict[str, Any]:
    return json.loads(runs[0])


# -- arkworks and `cryptography` helpers ----------------------------------------------------

def g1(h: str) -> Any:
    return G1Point.from_compressed_bytes(bytes.fromhex(h))


def g2(h: str) -> Any:
    return G2Point.from_compressed_bytes(bytes.fromhex(h))


def scalar(h: str) -> Any:
    return Scalar.from_be_bytes(bytes.fromhex(h))


def gt_bytes(x: Any) -> bytes:
    return bytes.fromhex(str(x))


def gt_pow(x: Any, k: int) -> Any:
    """x^k in GT by square-and-multiply (arkworks' GT ``*`` is the group operation)."""
    result, base = GT.one(), x
    while k:
        if k & 1:
            result = result * base
        base, k = base * base, k >> 1
    return result


def F(identity_hex: str) -> Any:
    return G1Point.hash_to_curve(bytes.fromhex(identity_hex), DST_ID)


def H4(k: Any) -> bytes:
    return hashlib.sha256(b"tag" + gt_bytes(k)).digest()


def kdf(k: Any, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                info=KDF_PREFIX + info).derive(gt_bytes(k))


def lp(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def mask_info(event_id: str, i: int, j: int) -> bytes:
    return b"c2" + lp(event_id.encode()) + i.to_bytes(2, "big") + j.to_bytes(2, "big")


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for child in node.values():
            yield from walk(child)
    elif isinstance(node, list):
        for child in node:
            yield from walk(child)


def credential_on(subscriber: dict[str, Any], attribute: str) -> dict[str, Any]:
    return next(c for c in subscriber["credentials"]
                if c["credential"]["attribute"] == attribute)


# -- the checks ---------------------------------------------------------------------------

def test_same_seed_gives_identical_bytes(runs: tuple[bytes, bytes, bytes]) -> None:
    first, second, other_seed = runs
    assert first == second
    assert first != other_seed


def test_gt_encoding_is_arkworks(v: dict[str, Any]) -> None:
    g, g_hat = G1Point(), G2Point()
    assert v["mpk"]["g"] == g.to_compressed_bytes().hex()
    assert v["mpk"]["g_hat"] == g_hat.to_compressed_bytes().hex()
    assert v["gt_generator"] == str(GT.pairing(g, g_hat))
    assert len(bytes.fromhex(v["gt_generator"])) == 576


def test_mpk_follows_from_msk(v: dict[str, Any]) -> None:
    mpk, msk = v["mpk"], v["msk"]
    g_hat = g2(mpk["g_hat"])
    alpha, phi, beta = scalar(msk["alpha"]), scalar(msk["phi"]), scalar(msk["beta"])
    assert g2(mpk["h"]) == g_hat * phi
    assert g2(mpk["hd"]) == g_hat * beta
    assert str(GT.pairing(g1(mpk["g2"]) * alpha, g_hat)) == mpk["Y"]
    assert str(gt_pow(GT.pairing(g1(mpk["g2"]), g_hat), int(msk["alpha"], 16))) == mpk["Y"]
    elements = "".join(mpk[k] for k in ("g", "g_hat", "g2", "h", "hd", "Y"))
    assert mpk["bytes"].endswith(elements)
    assert msk["bytes"].endswith(msk["alpha"] + msk["phi"] + msk["beta"])


def test_every_F_and_M_is_the_rfc9380_hash(v: dict[str, Any]) -> None:
    hashed = [node for node in walk(v) if "identity" in node and "F" in node]
    assert len(hashed) >= 30
    for node in hashed:
        assert F(node["identity"]).to_compressed_bytes().hex() == node["F"]
    for event in v["events"].values():
        m = G1Point.hash_to_curve(bytes.fromhex(event["signed_digest"]), DST_MSG)
        assert m.to_compressed_bytes().hex() == event["M"]


def test_identity_strings_follow_the_specification(v: dict[str, Any]) -> None:
    """Pu = lp(attribute) || lp(role) || lp(epoch, 8 bytes) || lp(credential bytes)."""
    def identity(cred: dict[str, Any], role: bytes) -> str:
        return lp(cred["attribute"].encode(), role, v["epoch"].to_bytes(8, "big"),
                  bytes.fromhex(cred["bytes"])).hex()

    for key in v["publisher"]["keys"]:
        assert key["identity"] == identity(key["credential"], b"PUB")
    for sub in v["subscribers"].values():
        for cred in sub["credentials"]:
            assert cred["identity"] == identity(cred["credential"], b"SUB")


def test_publisher_keys(v: dict[str, Any]) -> None:
    """e(P1, ĝ) = Y * e(F(Pu_PUB), P2)."""
    g_hat = g2(v["mpk"]["g_hat"])
    for key in v["publisher"]["keys"]:
        lhs = GT.multi_pairing([g1(key["P1"]), -F(key["identity"])], [g_hat, g2(key["P2"])])
        assert str(lhs) == v["mpk"]["Y"]
        assert key["bytes"].endswith(key["P1"] + key["P2"])


def test_subscriber_keys(v: dict[str, Any]) -> None:
    """e(D, hd) = Y * e(S1, ĝ) / e(F, S2) (one gamma_s binds D and every S1), and
    T = F^phi, i.e. e(T, ĝ) = e(F, h)."""
    mpk = v["mpk"]
    g_hat, h, hd = g2(mpk["g_hat"]), g2(mpk["h"]), g2(mpk["hd"])
    phi = scalar(v["msk"]["phi"])
    for sub in v["subscribers"].values():
        D = g1(sub["D"])
        for cred in sub["credentials"]:
            f = F(cred["identity"])
            binding = GT.multi_pairing([D, -g1(cred["S1"]), f], [hd, g_hat, g2(cred["S2"])])
            assert str(binding) == mpk["Y"]
            assert GT.pairing(g1(cred["T"]), g_hat) == GT.pairing(f, h)
            assert g1(cred["T"]) == f * phi


def test_position_keys_tags_and_route_test(v: dict[str, Any]) -> None:
    """K_ij = e(F_ij^phi, C1_i), R_ij = H4(K_ij); the matching subscriber's token passes
    the route test on every attribute, the non-matching one's on none."""
    phi = scalar(v["msk"]["phi"])
    matching, other = v["subscribers"]["matching"], v["subscribers"]["non_matching"]
    for event in v["events"].values():
        for a in event["attributes"]:
            C1 = g2(a["C1"])
            assert len(a["R"]) == len(a["E"]) == a["positions"]
            assert a["padding_positions"] == list(range(len(a["path"]), a["positions"]))
            for pos in a["path"]:
                j = pos["position"]
                K = GT.pairing(F(pos["identity"]) * phi, C1)
                assert str(K) == pos["K"]
                assert H4(K).hex() == a["R"][j]
                assert pos["mask_info"] == mask_info(event["event_id"], a["index"], j).hex()
            mine = credential_on(matching, a["name"])
            j = mine["credential"]["position"]
            assert H4(GT.pairing(g1(mine["T"]), C1)).hex() == a["R"][j]
            theirs = credential_on(other, a["name"])
            assert H4(GT.pairing(g1(theirs["T"]), C1)).hex() not in a["R"]


def test_unmasking_and_decryption(v: dict[str, Any]) -> None:
    """C2 = E XOR KDF(K, ...) is a G1 point with e(C2, ĝ) = e(F, C1); then
    Y^s = e(D, C0) * prod e(C2, S2) / e(S1, C1) opens the payload."""
    g_hat, beta = g2(v["mpk"]["g_hat"]), scalar(v["msk"]["beta"])
    sub = v["subscribers"]["matching"]
    for event in v["events"].values():
        C0 = g2(event["C0"])
        c1_sum = sum((g2(a["C1"]) for a in event["attributes"]), G2Point.identity())
        assert c1_sum * beta == C0  # C0 = hd^s = ĝ^(beta * sum b_i)
        g1s, g2s = [g1(sub["D"])], [C0]
        for a in event["attributes"]:
            mine = credential_on(sub, a["name"])
            j, C1 = mine["credential"]["position"], g2(a["C1"])
            K = GT.pairing(g1(mine["T"]), C1)
            mask = kdf(K, mask_info(event["event_id"], a["index"], j), 48)
            C2 = G1Point.from_compressed_bytes(xor(bytes.fromhex(a["E"][j]), mask))
            position = a["path"][j]
            assert C2.to_compressed_bytes().hex() == position["C2"]
            assert GT.pairing(C2, g_hat) == GT.pairing(F(position["identity"]), C1)
            g1s += [C2, -g1(mine["S1"])]
            g2s += [g2(mine["S2"]), C1]
        Ys = GT.multi_pairing(g1s, g2s)
        assert str(Ys) == event["decryption"]["Ys"]
        key = kdf(Ys, b"payload" + lp(event["event_id"].encode()))
        assert key.hex() == event["decryption"]["payload_key"]
        sealed = bytes.fromhex(event["sealed"])
        payload = ChaCha20Poly1305(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:],
                                                bytes.fromhex(event["header"]["bytes"]))
        assert payload.hex() == event["payload"]
        unpadded = payload.rstrip(b"\x00")
        assert unpadded.endswith(b"\x80") and len(payload) % 256 == 0
        assert msgpack.unpackb(unpadded[:-1]) == {"v": event["values"],
                                            "b": bytes.fromhex(event["body"])}


def signed_digest(event: dict[str, Any]) -> bytes:
    """SHA-256 of tag 12, format version, lp(header), C0, per attribute C1 || count || E ||
    count || R, every P2, lp(sealed)."""
    out = bytearray((TAG_DIGEST, FORMAT_VERSION))
    header = bytes.fromhex(event["header"]["bytes"])
    out += struct.pack(">I", len(header)) + header + bytes.fromhex(event["C0"])
    for a in event["attributes"]:
        out += bytes.fromhex(a["C1"])
        for items in (a["E"], a["R"]):
            out += struct.pack(">H", len(items)) + b"".join(bytes.fromhex(x) for x in items)
    for s in event["signatures"]:
        out += bytes.fromhex(s["P2"])
    sealed = bytes.fromhex(event["sealed"])
    out += struct.pack(">I", len(sealed)) + sealed
    return hashlib.sha256(out).digest()


def test_signatures_and_batch_verification(v: dict[str, Any]) -> None:
    """e(Sig_i, ĝ) = Y * e(F_i, P2_i) * e(m, C1_i) each, and the weighted batch
    e(prod Sig^w, ĝ) = Y^(sum w) * prod e(F^w, P2) * e(m, prod C1^w)."""
    g_hat, Y_hex = g2(v["mpk"]["g_hat"]), v["mpk"]["Y"]
    Y = GT.pairing(g1(v["mpk"]["g2"]) * scalar(v["msk"]["alpha"]), g_hat)
    publisher_P2 = {k["credential"]["label"]: k["P2"] for k in v["publisher"]["keys"]}
    ms = {}
    for name, event in v["events"].items():
        assert signed_digest(event).hex() == event["signed_digest"]
        m = G1Point.hash_to_curve(bytes.fromhex(event["signed_digest"]), DST_MSG)
        ms[name] = m
        sigs, attrs = event["signatures"], event["attributes"]
        for s, a in zip(sigs, attrs, strict=True):
            assert publisher_P2[s["credential"]["label"]] == s["P2"]
            check = GT.multi_pairing([g1(s["Sig"]), -F(s["identity"]), -m],
                                     [g_hat, g2(s["P2"]), g2(a["C1"])])
            assert str(check) == Y_hex
        batch = event["batch_verification"]
        w = batch["weights"]
        assert all(x % 2 == 1 and x < 2**64 for x in w)
        sig_w = G1Point.multiexp_unchecked([g1(s["Sig"]) for s in sigs], [Scalar(x) for x in w])
        c1_w = G2Point.multiexp_unchecked([g2(a["C1"]) for a in attrs], [Scalar(x) for x in w])
        f_w = [F(s["identity"]) * Scalar(x) for s, x in zip(sigs, w, strict=True)]
        lhs = GT.pairing(sig_w, g_hat)
        rhs = gt_pow(Y, sum(w)) * GT.multi_pairing([*f_w, m],
                                                     [*(g2(s["P2"]) for s in sigs), c1_w])
        assert lhs == rhs
        assert str(lhs) == batch["lhs"] and str(gt_pow(Y, sum(w))) == batch["Y_power"]
        assert sig_w.to_compressed_bytes().hex() == batch["Sig_combined"]
        assert c1_w.to_compressed_bytes().hex() == batch["C1_combined"]
        assert [p.to_compressed_bytes().hex() for p in f_w] == batch["F_weighted"]
    # a signature does not verify against another event's digest
    one = v["events"]["one_attribute"]
    s, a = one["signatures"][0], one["attributes"][0]
    wrong = GT.multi_pairing([g1(s["Sig"]), -F(s["identity"]), -ms["three_attribute"]],
                             [g_hat, g2(s["P2"]), g2(a["C1"])])
    assert str(wrong) != Y_hex


def test_encoded_objects_carry_the_listed_elements(v: dict[str, Any]) -> None:
    for event in v["events"].values():
        encoded = event["encoded"]
        for part in (event["header"]["bytes"], event["C0"], event["sealed"]):
            assert part in encoded
        for a, s in zip(event["attributes"], event["signatures"], strict=True):
            count = len(a["E"]).to_bytes(2, "big").hex()
            assert a["C1"] + count + "".join(a["E"]) + count + "".join(a["R"]) in encoded
            assert s["Sig"] + s["P2"] in encoded


def test_connection_request(v: dict[str, Any]) -> None:
    """Entry j opens with the token of its credential: K = e(T, U), key = KDF(K, "cr"),
    ChaCha20-Poly1305 with AD = lp("connection-request", A, epoch, j); padding does not."""
    request = v["connection_request"]
    phi = scalar(v["msk"]["phi"])
    attribute, epoch = request["attribute"], request["epoch"]
    requester_position = request["requester"]["position"]
    server = Ed25519PublicKey.from_public_bytes(bytes.fromhex(request["server_public_key"]))
    server.verify(bytes.fromhex(request["signature"]), bytes.fromhex(request["signed_body"]))
    assert request["signed_body"] in request["bytes"]

    def open_entry(T: Any, entry: dict[str, Any]) -> bytes:
        j = entry["position"]
        key = kdf(GT.pairing(T, g2(entry["U"])), b"cr")
        sealed = bytes.fromhex(entry["sealed"])
        ad = lp(b"connection-request", attribute.encode(), epoch.to_bytes(8, "big"),
                j.to_bytes(2, "big"))
        return ChaCha20Poly1305(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], ad)

    entries = request["entries"]
    real = [e for e in entries if not e["padding"]]
    assert [e["position"] for e in entries] == list(range(len(entries)))
    assert len(real) == requester_position + 1
    for entry in real:
        T = F(entry["identity"]) * phi
        assert str(GT.pairing(T, g2(entry["U"]))) == entry["K"]
        plain = open_entry(T, entry)
        assert plain.hex() == entry["plaintext"] and len(plain) == SW_BYTES + 2
        assert int.from_bytes(plain[SW_BYTES:], "big") == requester_position
    for entry in entries:
        if entry["padding"]:
            g2(entry["U"])  # padding looks like the rest: a valid G2 point
            with pytest.raises(InvalidTag):
                open_entry(F(real[-1]["identity"]) * phi, entry)

    mine = credential_on(v["subscribers"]["matching"], attribute)
    opened = open_entry(g1(mine["T"]), entries[mine["credential"]["position"]])
    assert opened.hex() == entries[mine["credential"]["position"]]["plaintext"]
    theirs = credential_on(v["subscribers"]["non_matching"], attribute)
    with pytest.raises(InvalidTag):
        open_entry(g1(theirs["T"]), entries[theirs["credential"]["position"]])


#: What arkworks makes of each listed reason (below); any other reason it refuses.
ARKWORKS_READING = {"identity": "identity", "non_canonical_identity": "non_canonical_identity",
                    "identity_with_sign_flag": "non_canonical_identity",
                    "not_in_subgroup": "not_in_subgroup"}


def arkworks_reading(point: Any, data: bytes) -> str:
    """What arkworks makes of compressed bytes: refused, a curve point outside the
    subgroup (its unchecked decoder takes it), the identity spelled canonically or not
    (arkworks ignores the bits after an infinity flag), or a valid point."""
    try:
        decoded = point.from_compressed_bytes(data)
    except ValueError:
        try:
            point.from_compressed_bytes_unchecked(data)
        except ValueError:
            return "refused"
        return "not_in_subgroup"
    if decoded != point.identity():
        return "valid"
    return "identity" if decoded.to_compressed_bytes() == data else "non_canonical_identity"


def test_rejected_encodings(v: dict[str, Any]) -> None:
    """The project refuses every listed encoding; arkworks agrees: it refuses it, finds it
    off the subgroup, or decodes the identity (which the scheme refuses), re-encoding a
    non-canonical spelling to other bytes. GT has no arkworks decoder: its entries are
    checked with integers (a coefficient >= p; an element of Fp whose order is not q).
    Controls: both take the generators."""
    rejected, group = v["rejected_encodings"], load_group("mcl")
    for name, point, generator in (("G1", G1Point, v["mpk"]["g"]),
                                   ("G2", G2Point, v["mpk"]["g_hat"])):
        kind = GroupKind(name)
        assert arkworks_reading(point, bytes.fromhex(generator)) == "valid"
        group.deserialize(kind, bytes.fromhex(generator))
        assert set(ARKWORKS_READING) | {"x_not_reduced", "not_on_curve"} <= {
            e["reason"] for e in rejected[name]}
        for entry in rejected[name]:
            data = bytes.fromhex(entry["bytes"])
            with pytest.raises(GroupError):
                group.deserialize(kind, data)
            assert arkworks_reading(point, data) == ARKWORKS_READING.get(entry["reason"],
                                                                         "refused"), entry
    group.deserialize(GroupKind("GT"), bytes.fromhex(v["gt_generator"]))
    for entry in rejected["GT"]:
        data = bytes.fromhex(entry["bytes"])
        with pytest.raises(GroupError):
            group.deserialize(GroupKind("GT"), data)
        coefficients = [int.from_bytes(data[k:k + 48], "little") for k in range(0, 576, 48)]
        if entry["reason"] == "coefficient_not_reduced":
            assert max(coefficients) >= P
        else:
            assert entry["reason"] == "not_in_subgroup" and not any(coefficients[1:])
            assert 0 < coefficients[0] < P and pow(coefficients[0], Q, P) != 1
