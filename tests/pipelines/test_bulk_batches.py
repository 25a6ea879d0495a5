"""The column-wise batch decomposition against the per-request reference, row for row."""

from __future__ import annotations

from contextlib import nullcontext

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibe_pubsub.credentials.schema import Schema, default_schema
from ibe_pubsub.evaluation.synthetic_requests import random_requests
from ibe_pubsub.pipelines.batches import COPIES, DECOMPOSED, decompose_batch
from ibe_pubsub.pipelines.inputs import PARSED
from ibe_pubsub.pipelines.local_job import with_copies
from ibe_pubsub.pipelines.predicate_columns import parse_column
from ibe_pubsub.pipelines.requests import (
    Rejected,
    Settings,
    decompose_request,
    predicate_credentials,
)

STOCKS = default_schema()
# Small domains: an int domain with fewer values than cells, an odd float domain, an
# alphabet (fine string splits) and a negative int domain.
ODD = Schema.from_dict({"name": "odd", "attributes": [
    {"name": "tick", "type": "string", "max_length": 3, "alphabet": "AB"},
    {"name": "level", "type": "int", "min": 0, "max": 10, "bits": 5},
    {"name": "temp", "type": "float", "min": -3.5, "max": 7.25, "bits": 6},
    {"name": "delta", "type": "int", "min": -1000, "max": 37, "bits": 3},
]})


def reference_batch(options: Settings, batch: pa.RecordBatch) -> pa.RecordBatch:
    """What ``decompose_batch`` must return: ``decompose_request`` on each row in turn."""
    rows = []
    names = ("identity", "role", "predicate", COPIES, "source", "line", "raw", "reason")
    for identity, role, predicate, copies, source, line, raw, problem in zip(
            *(batch.column(n).to_pylist() for n in names), strict=True):
        base = dict.fromkeys(DECOMPOSED.names) | {"identity": identity, "role": role}
        try:
            if problem is not None:
                raise Rejected(problem)
            credentials = decompose_request(options, identity, role, predicate, copies)
        except Rejected as exc:
            rows.append(base | {"predicate": predicate, "reason": str(exc), "source": source,
                                "line": line, "raw": raw})
            continue
        rows += [base | {"attribute": c.attribute, "credential": c.credential, "fine": c.fine,
                         "position": c.position} for c in credentials]
    return pa.RecordBatch.from_pylist(rows, schema=DECOMPOSED)


def _batch(requests: list[tuple[str | None, str | None, str | None]],
           problems: list[str | None] | None = None) -> pa.RecordBatch:
    n = len(requests)
    table = pa.table({
        "identity": [r[0] for r in requests], "role": [r[1] for r in requests],
        "predicate": [r[2] for r in requests], "source": ["in.csv"] * n,
        "line": list(range(1, n + 1)), "raw": [None] * n,
        "reason": problems or [None] * n}, schema=PARSED)
    return with_copies(table).combine_chunks().to_batches()[0]


def _same(options: Settings, batch: pa.RecordBatch) -> None:
    got, want = decompose_batch(options, batch), reference_batch(options, batch)
    assert got.schema == want.schema
    for name in DECOMPOSED.names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def _numbers(schema: Schema) -> st.SearchStrategy[str]:
    """Number texts near what matters: domain ends, cell boundaries, just outside."""
    special = []
    for a in schema.attributes:
        if a.is_numeric:
            step = (a.max - a.min) / a.cells  # type: ignore[operator]
            special += [a.min, a.max, a.min - 1, a.max + 1, a.min + step, a.max - step,
                        a.min + 3 * step, (a.min + a.max) / 2]  # type: ignore[operator]
    texts = [str(x) for x in special] + [f"{x:.2f}" for x in special]
    return st.one_of(st.sampled_from(texts),
                     st.integers(-1_100_000, 1_100_000).map(str),
                     st.floats(-2000, 2000, allow_nan=False).map(lambda x: f"{x:.3f}"),
                     st.sampled_from(["1e3", "-0", "007", "2.5E-1", "99999999999999999999"]))


def _clauses(schema: Schema) -> st.SearchStrategy[str]:
    names = st.sampled_from([*schema.names, "colour"])
    number = _numbers(schema)
    text = st.one_of(st.text(alphabet="ABab\u00e9\"\\ ", max_size=5).map(
        lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'),
        st.sampled_from(['""', '"A"', '"AB and B"', '"ABBA"']))
    return st.one_of(
        st.builds(lambda n, o, v: f"{n} {o} {v}", names,
                  st.sampled_from(["<", "<=", ">", ">=", "="]), st.one_of(number, text)),
        st.builds(lambda n, lo, hi: f"{n} in [{lo}, {hi}]", names, number, number),
        st.builds(lambda n, v: f"{n} prefix {v}", names, st.one_of(text, number)))


def _predicates(schema: Schema) -> st.SearchStrategy[str | None]:
    joined = st.lists(_clauses(schema), max_size=4).flatmap(
        lambda cs: st.sampled_from([" and ", " and  ", "and"]).map(lambda j: j.join(cs)))
    return st.one_of(st.none(), joined, st.sampled_from(["", "price in [3, ", "  level = 3"]))


def _requests(schema: Schema) -> st.SearchStrategy[list]:
    identity = st.sampled_from(["alice", "bob", "carol", "dave", "erin", "frank", None, "",
                                "bad name"])
    role = st.sampled_from(["subscriber", "subscriber", "publisher", "admin", None])
    return st.lists(st.tuples(identity, role, _predicates(schema)), min_size=1, max_size=12)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schema=st.sampled_from([STOCKS, ODD]),
       depth=st.integers(0, 2), cap=st.sampled_from([None, None, 1, 2, 3]))
def test_batch_equals_the_reference_row_for_row(data, schema, depth, cap):
    requests = data.draw(_requests(schema))
    # unique identities mostly, so that most requests reach their predicate
    requests = [(f"{i}-{r[0]}" if r[0] and data.draw(st.booleans()) else r[0], *r[1:])
                for i, r in enumerate(requests)]
    problems = [data.draw(st.sampled_from([None] * 5 + ["1 field(s), but the header has 3"]))
                for _ in requests]
    _same(Settings(schema, depth, cap), _batch(requests, problems))


EDGES = [
    "price >= 0", "price <= 1000", "price < 1000", "price > 0", "price = 0", "price = 1000",
    "price in [0, 1000]", "price in [0.0, 1000.0]", "price = 125", "price < 125",
    "price > 125", "price in [125, 250]", "price < 15.2587890625", "price > 15.2587890625",
    "price in [999.99, 1000]", "price in [0.01, 0.02]", "volume = 0", "volume = 1000000",
    "volume in [0, 1000000]", "volume > 999999", "volume < 1", "volume = 524288",
    "volume in [1, 999999]", 'symbol = "" and price = 7', 'symbol prefix "ABCDEFGHIJ"',
    'symbol = "\u00e9t\u00e9"', 'symbol prefix ""',
]
REJECTED = ["price > 1000", "price < 0", "volume < 0", "volume > 1000000", "price in [5, 3]",
            "volume in [7, 6]", "price > 3 and price < 2", "colour = 3", 'price = "IBM"',
            'symbol > "A"', "volume >= 1e3 and volume < 1e3"]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_edge_cases_equal_the_reference_and_take_the_column_wise_path(depth):
    """Domain ends, single points, full domains and cell boundaries are settled column-wise
    (the control: were they all left to the reference, equality would prove nothing)."""
    texts = pa.array(EDGES)
    assert parse_column(STOCKS, texts).settled.all()
    assert not parse_column(STOCKS, pa.array(REJECTED)).settled.any()
    requests = [(f"id{i}", "subscriber" if i % 3 else "publisher", p)
                for i, p in enumerate(EDGES + REJECTED)]
    _same(Settings(STOCKS, depth), _batch(requests))
    decomposed = decompose_batch(Settings(STOCKS, depth), _batch(requests))
    assert decomposed.column("reason").null_count == decomposed.num_rows - len(REJECTED)


def test_synthetic_requests_are_settled_column_wise_and_equal_the_reference():
    table = random_requests(STOCKS, 300, seed=11)
    texts = table.column("predicate").combine_chunks()
    left = [t for t, done in zip(texts.to_pylist(), parse_column(STOCKS, texts).settled,
                                 strict=True) if not done]
    assert len(left) < 10  # only the empty text and ranges that select nothing remain
    for text in left:
        with pytest.raises(Rejected) if text else nullcontext():
            predicate_credentials(Settings(STOCKS), text)
    rows = list(zip(*(table.column(c).to_pylist() for c in ("identity", "role", "predicate")),
                    strict=True))
    for depth, cap in ((1, None), (2, 3)):
        _same(Settings(STOCKS, depth, cap), _batch(rows))


def test_too_many_credentials_and_repeated_predicates():
    """The row limit counts fine rows for subscribers only; a repeated predicate is read once
    and still gives each request its own rows."""
    wide = "price in [0.01, 999.9] and volume in [1, 999999]"
    requests = [("a", "subscriber", wide), ("b", "publisher", wide), ("c", "subscriber", wide),
                ("d", "subscriber", "price < 3"), ("e", "subscriber", "price < 3")]
    batch = _batch(requests)
    _same(Settings(STOCKS, 4), batch)
    out = decompose_batch(Settings(STOCKS, 4), batch)
    assert out.column("reason").to_pylist().count(None) < out.num_rows
    assert "exceed the key server's limit" in str(out.column("reason").to_pylist())
