"""Schema loading, validation, canonical form and event-value validation."""

from __future__ import annotations

import json
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repository import REPO_ROOT

from ibe_pubsub.cli.app import main
from ibe_pubsub.credentials.schema import (
    BUILTIN_SCHEMAS,
    Attribute,
    Schema,
    SchemaError,
    builtin_schema,
    default_schema,
    load_schema,
    resolve_schema,
    schema_from_toml,
)

SETTINGS = settings(derandomize=True, deadline=None, max_examples=100)

STOCKS_TOML = """
name = "stocks"
comment = "extra keys are ignored"
[[attributes]]
name = "symbol"
type = "string"
max_length = 8
[[attributes]]
name = "price"
type = "float"
min = 0.0
max = 1000.0
bits = 16
[[attributes]]
name = "volume"
type = "int"
min = 0
max = 1_000_000
bits = 20
unit = "shares"
"""


def test_default_schema_shape() -> None:
    s = default_schema()
    assert s.name == "stocks"
    assert s.names == ("symbol", "price", "volume")
    sym, price, vol = s.attributes
    assert (sym.type, sym.max_length, sym.kind) == ("string", 8, "str")
    assert (price.type, price.min, price.max, price.bits, price.kind) == (
        "float", 0.0, 1000.0, 16, "num")
    assert (vol.type, vol.min, vol.max, vol.bits) == ("int", 0, 1_000_000, 20)
    assert s.index("volume") == 2


def test_id_is_sha256_of_canonical_form_and_ignores_extra_keys() -> None:
    s = schema_from_toml(STOCKS_TOML)
    assert s == default_schema()
    assert s.id == default_schema().id
    assert re.fullmatch(r"[0-9a-f]{64}", s.id)
    raw = s.canonical_bytes()
    assert b" " not in raw
    doc = json.loads(raw)
    assert raw == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert "comment" not in doc and "unit" not in doc["attributes"][2]


def test_load_schema_from_file(tmp_path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(STOCKS_TOML)
    assert load_schema(path) == default_schema()
    path.write_text("name = ")
    with pytest.raises(SchemaError, match="TOML"):
        load_schema(path)


def test_schema_arguments_take_a_built_in_name_or_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # far from the repository: the name needs no path
    assert resolve_schema("stocks") == default_schema()
    Path("mine.toml").write_text(STOCKS_TOML.replace('"stocks"', '"mine"'))
    assert resolve_schema("mine.toml").name == "mine"
    Path("stocks").write_text("not = [toml")  # the built-in name wins; ./stocks is the file
    assert resolve_schema("stocks") == default_schema()
    with pytest.raises(SchemaError, match="not valid TOML"):
        resolve_schema("./stocks")
    with pytest.raises(SchemaError, match=r"no schema file 'stock' .*\(built-in: stocks\)"):
        resolve_schema("stock")
    with pytest.raises(SchemaError, match="Is a directory"):
        resolve_schema(str(tmp_path))


def test_built_in_schemas_ship_in_the_wheel() -> None:
    """setuptools copies package data by pattern; a built-in name must match one."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]
    patterns = data.get("*", []) + data.get("credentials", [])
    for name in BUILTIN_SCHEMAS:
        assert any(fnmatch(f"{name}.toml", pattern) for pattern in patterns), name
        assert builtin_schema(name).name == name


@pytest.mark.parametrize("command", [("keyserver", "init", "--data", "ks"),
                                     ("bulk", "decompose", "--input", "x", "--output", "y"),
                                     ("bench", "bulk")])
def test_every_schema_option_refuses_an_unknown_name_in_one_line(command, tmp_path,
                                                                 monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        code = main([*command, "--schema", "stock"])
    except SystemExit as stop:  # argparse's own exit
        code = stop.code
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "--schema" in errors[0] and "built-in: stocks" in errors[0]
    assert not Path("ks").exists()  # refused while parsing, before any work


def test_dict_round_trip_and_order_matters() -> None:
    s = default_schema()
    assert Schema.from_dict(s.to_dict()) == s
    d = s.to_dict()
    d["attributes"].reverse()
    other = Schema.from_dict(d)
    assert other.names == ("volume", "price", "symbol")
    assert other.id != s.id


def test_float_domain_given_as_ints_is_normalized() -> None:
    a = Attribute.from_dict({"name": "p", "type": "float", "min": 0, "max": 10, "bits": 4})
    b = Attribute("p", "float", min=0.0, max=10.0, bits=4)
    assert a == b and isinstance(a.min, float)


@SETTINGS
@given(bits=st.integers(1, 32), lo=st.integers(-100, 100), width=st.integers(1, 100),
       max_length=st.integers(1, 20))
def test_id_changes_with_every_field(bits: int, lo: int, width: int, max_length: int) -> None:
    def make(**kw: object) -> Schema:
        base = {"bits": bits, "min": lo, "max": lo + width, "max_length": max_length}
        base.update(kw)
        return Schema.from_dict({"name": "t", "attributes": [
            {"name": "s", "type": "string", "max_length": base["max_length"]},
            {"name": "n", "type": "int", "min": base["min"], "max": base["max"],
             "bits": base["bits"]}]})

    ref = make()
    assert make().id == ref.id
    variants = [make(bits=bits % 32 + 1), make(min=lo - 1), make(max=lo + width + 1),
                make(max_length=max_length + 1)]
    assert len({ref.id, *(v.id for v in variants)}) == 5


def test_string_alphabet_is_part_of_the_id() -> None:
    base = {"name": "s", "type": "string", "max_length": 4}
    a = Schema.from_dict({"name": "x", "attributes": [base]})
    b = Schema.from_dict({"name": "x", "attributes": [{**base, "alphabet": "AB"}]})
    assert b.attributes[0].alphabet == "AB"
    assert a.id != b.id


def _schema(*attrs: dict, name: str = "t") -> Schema:
    return Schema.from_dict({"name": name, "attributes": list(attrs)})


NUM = {"name": "n", "type": "int", "min": 0, "max": 10, "bits": 4}


@pytest.mark.parametrize(("attrs", "message"), [
    ([NUM, NUM], "duplicate attribute 'n'"),
    ([{**NUM, "type": "decimal"}], "unknown type 'decimal'"),
    ([{**NUM, "min": 10}], "min .* must be smaller than max"),
    ([{**NUM, "min": 11}], "min .* must be smaller than max"),
    ([{**NUM, "bits": 0}], "bits must be an integer in 1..32"),
    ([{**NUM, "bits": 33}], "bits must be an integer in 1..32"),
    ([{**NUM, "bits": 2.5}], "bits must be an integer"),
    ([{**NUM, "min": 0.5}], "min of an int attribute must be an integer"),
    ([{"name": "p", "type": "float", "min": 0.0, "max": float("inf"), "bits": 3}],
     "finite"),
    ([{**NUM, "name": "my-attr"}], "'my-attr': name must be an identifier"),
    ([{**NUM, "name": "2x"}], "name must be an identifier"),
    ([{**NUM, "name": "prefix"}], "reserved word"),
    ([{"name": "n", "type": "int", "min": 0, "max": 9}], "needs 'bits'"),
    ([{"name": "s", "type": "string", "max_length": 0}], "max_length must be at least 1"),
    ([{"name": "s", "type": "string"}], "needs an integer max_length"),
    ([{"name": "s", "type": "string", "max_length": 3, "alphabet": "AA"}], "repeated"),
    ([{"name": "s", "type": "string", "max_length": 3, "alphabet": ""}], "non-empty"),
    ([{"name": "s", "type": "string", "max_length": 3, "alphabet": "A\ufffd"}], "reserved"),
    ([], "no attributes"),
])
def test_invalid_schemas(attrs: list, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        _schema(*attrs)


def test_invalid_documents() -> None:
    with pytest.raises(SchemaError, match="'attributes' array"):
        Schema.from_dict({"name": "x"})
    with pytest.raises(SchemaError, match="name"):
        Schema.from_dict({"attributes": [NUM]})
    with pytest.raises(SchemaError, match="must be a table"):
        Schema.from_dict({"name": "x", "attributes": [3]})


def test_attribute_lookup_error_is_clear() -> None:
    with pytest.raises(SchemaError, match=r"no attribute 'bid'.*symbol, price, volume"):
        default_schema().attribute("bid")


def test_validate_values_accepts_good_events() -> None:
    s = default_schema()
    ev = {"volume": 5, "price": 12, "symbol": "A VERY LONG SYMBOL NAME"}
    out = s.validate_values(ev)
    assert list(out) == ["symbol", "price", "volume"]
    assert out == ev
    assert s.validate_values({"symbol": "", "price": 1000.0, "volume": 1_000_000})


@pytest.mark.parametrize(("values", "message"), [
    ({"price": 1.0, "volume": 1}, "'symbol' is missing"),
    ({"symbol": "X", "price": 1.0, "volume": 1, "bid": 2}, "unknown attribute 'bid'"),
    ({"symbol": 3, "price": 1.0, "volume": 1}, "'symbol' must be a string"),
    ({"symbol": "X", "price": "1", "volume": 1}, "'price' must be a number"),
    ({"symbol": "X", "price": True, "volume": 1}, "'price' must be a number"),
    ({"symbol": "X", "price": 1.0, "volume": 1.0}, "'volume' must be an int"),
    ({"symbol": "X", "price": 1.0, "volume": False}, "'volume' must be an int"),
    ({"symbol": "X", "price": -0.5, "volume": 1}, "'price': value -0.5 outside"),
    ({"symbol": "X", "price": float("nan"), "volume": 1}, "'price': value nan outside"),
    ({"symbol": "X", "price": 1.0, "volume": 1_000_001}, "'volume': value 1000001 outside"),
])
def test_validate_values_errors_name_the_attribute(values: dict, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        default_schema().validate_values(values)
