"""The docs cannot rot: their examples run against the code, and their links stay inside
the repository (a user's clone is all they have)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from repository import REPO_ROOT

from ibe_pubsub.credentials.predicates import PredicateError, parse_predicate
from ibe_pubsub.credentials.schema import builtin_schema, default_schema, schema_from_toml
from ibe_pubsub.peer.events_io import EventFileError, parse_event

REPO = REPO_ROOT
DOCS = REPO / "docs"
STOCKS = default_schema()
EVERYTHING = "(everything)"


def _after(doc: Path, marker: str) -> list[str]:
    """The lines after ``<!-- marker -->`` up to the next blank line."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"<!-- {marker} -->") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _code(cell: str) -> str:
    cell = cell.strip()
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def _table(doc: Path, marker: str) -> list[tuple[str, str]]:
    """The two-column table after the marker, code spans unwrapped, header dropped."""
    rows = [line.strip().strip("|").split("|") for line in _after(doc, marker)]
    assert all(len(row) == 2 for row in rows), f"{doc.name}: {marker}: not a 2-column table"
    return [(_code(a), _code(b)) for a, b in rows[2:]]


def _fenced(doc: Path, marker: str) -> list[str]:
    """The lines of the fenced block right after the marker."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"<!-- {marker} -->") + 1
    assert lines[start].startswith("```"), f"{doc.name}: no code block after {marker}"
    end = lines.index("```", start + 1)
    return lines[start + 1:end]


# -- predicates.md ---------------------------------------------------------------------------

VALID_PREDICATES = _table(DOCS / "predicates.md", "examples: valid")
INVALID_PREDICATES = _table(DOCS / "predicates.md", "examples: invalid")


@pytest.mark.parametrize(("text", "canonical"), VALID_PREDICATES)
def test_every_valid_predicate_example_parses_to_its_documented_canonical_form(text, canonical):
    parsed = parse_predicate(STOCKS, text)
    assert str(parsed) == ("" if canonical == EVERYTHING else canonical)
    assert parse_predicate(STOCKS, str(parsed)) == parsed


@pytest.mark.parametrize(("text", "message"), INVALID_PREDICATES)
def test_every_invalid_predicate_example_is_refused_with_its_documented_message(text, message):
    with pytest.raises(PredicateError) as refused:
        parse_predicate(STOCKS, text)
    assert refused.value.message == message


def test_the_predicate_tables_are_there():
    assert len(VALID_PREDICATES) >= 10 and len(INVALID_PREDICATES) >= 20


# -- events.md -------------------------------------------------------------------------------

INVALID_EVENTS = _table(DOCS / "events.md", "events: invalid")


def test_every_valid_event_example_parses():
    lines = _fenced(DOCS / "events.md", "events: valid")
    events = [parse_event(STOCKS, json.loads(line), f"line {n}")
              for n, line in enumerate(lines, 1)]
    assert len(events) == 3 and len({e.event_id for e in events}) == 3


@pytest.mark.parametrize(("line", "message"), INVALID_EVENTS)
def test_every_invalid_event_example_is_refused_with_its_documented_message(line, message):
    with pytest.raises(EventFileError) as refused:
        parse_event(STOCKS, json.loads(line), "events.jsonl:1")
    assert str(refused.value) == f"events.jsonl:1: {message}"


# -- schema.md -------------------------------------------------------------------------------

def test_the_schema_doc_shows_the_built_in_schema_and_its_id():
    doc = DOCS / "schema.md"
    shown = "\n".join(_fenced(doc, "schema: stocks")) + "\n"
    assert shown == (REPO / "credentials" / "stocks.toml").read_text(encoding="utf-8")
    assert schema_from_toml(shown) == builtin_schema("stocks")
    assert _after(doc, "schema id: stocks") == [f"`{STOCKS.id}`"]


# -- links -----------------------------------------------------------------------------------

def _markdown_files() -> list[Path]:
    skip = {".venv", ".git", "ibe_pubsub.egg-info", "node_modules"}
    return sorted(p for p in REPO.rglob("*.md")
                  if not skip.intersection(p.relative_to(REPO).parts))


def test_docs_link_only_to_files_inside_the_repository():
    broken = []
    for doc in _markdown_files():
        text = doc.read_text(encoding="utf-8")
        # a path in prose, not only in a link, that leaves the clone
        for path in re.findall(r"(?<![\w/.])\.\./[\w./-]+", text):
            resolved = (doc.parent / path).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{doc.relative_to(REPO)}: mentions {path}")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same file
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == []
