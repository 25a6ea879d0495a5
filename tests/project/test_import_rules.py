"""The layering of the packages, read from the code's own imports.

- ``credentials`` imports nothing of ours; ``overlay`` and ``keyserver`` import only
  ``credentials``; ``migrations`` only ``keyserver``;
- ``pipelines`` imports ``credentials`` and the key server's client;
- ``peer`` imports ``overlay``, ``credentials`` and the key server's client (with its
  bundle decoding);
- ``client`` (the application API) imports ``peer`` and what ``peer`` may;
- ``evaluation`` and ``cli`` sit on top (and no library package imports them).

Across packages, code imports only the names a package's ``__init__`` exports (its
``__all__``), as ``from ibe_pubsub.overlay import PeerMachine``. No module imports itself
back through others, at module level or inside a function.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from repository import LIBRARIES, PACKAGES, REPO_ROOT, module_name, package_sources

MAY_IMPORT = {
    "credentials": set(),
    "overlay": {"credentials"},
    "keyserver": {"credentials"},
    "migrations": {"keyserver"},
    "pipelines": {"credentials", "keyserver"},
    "peer": {"credentials", "overlay", "keyserver"},
    "client": {"credentials", "overlay", "keyserver", "peer"},
    "bridges": {"credentials", "overlay", "keyserver", "peer", "client"},
    "evaluation": set(LIBRARIES),
    "cli": {*LIBRARIES, "evaluation"},
}
#: The key server's modules that its callers among the libraries may use: the clients (of
#: one key server, and of a threshold deployment's members).
KEY_SERVER_CLIENT = {"client", "threshold_client", "bundles", "exceptions"}
LIMITED_TO_THE_CLIENT = {"pipelines", "peer", "client"}


@dataclass(frozen=True)
class Import:
    """One imported name: in module ``importer``, ``from module import name``."""

    importer: str
    module: str
    name: str | None
    line: int
    typing_only: bool = False


def absolute(importer: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><module> import ...`` in ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base[:len(base) - level + 1] if is_package else base[:len(base) - level]
    return ".".join([*base, *([module] if module else [])])


def imports_of(importer: str, source: str, is_package: bool = False) -> Iterator[Import]:
    """Every import in ``source``, at any depth (function bodies too), relative ones made
    absolute and ``from ibe_pubsub import X`` read as an import of ``ibe_pubsub.X``; those
    under ``if TYPE_CHECKING:`` are marked, since they never run."""
    tree = ast.parse(source)
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", "") == "TYPE_CHECKING"
                   for stmt in node.body for inner in ast.walk(stmt)}
    for node in ast.walk(tree):
        unused = id(node) in typing_only
        if isinstance(node, ast.ImportFrom):
            module = absolute(importer, is_package, node.module, node.level)
            for alias in node.names:
                if module == "ibe_pubsub":
                    yield Import(importer, f"ibe_pubsub.{alias.name}", None, node.lineno, unused)
                else:
                    yield Import(importer, module, alias.name, node.lineno, unused)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, None, node.lineno, unused)


def project_imports() -> list[Import]:
    found = []
    for path in package_sources():
        found.extend(i for i in imports_of(module_name(path), path.read_text(),
                                           path.name == "__init__.py")
                     if i.module.startswith("ibe_pubsub."))
    return found


def package_of(module: str) -> str:
    return module.split(".")[1]


def face_exports(package: str) -> dict[str, str]:
    """The names ``ibe_pubsub.PACKAGE`` exports, each with the module that defines it, as its
    ``__init__`` maps them (``lazy_exports(__name__, {module: names})``), read without
    importing anything."""
    tree = ast.parse((REPO_ROOT / package / "__init__.py").read_text())
    where = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports":
            for module, names in ast.literal_eval(node.args[1]).items():
                where.update(dict.fromkeys(names, module))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.count(".") == 2:
            where.update({a.asname or a.name: node.module.split(".")[2] for a in node.names})
    return where


def violations(imports: list[Import]) -> list[str]:
    """What breaks the layering or goes around a package's face."""
    found = []
    faces: dict[str, dict[str, str]] = {}
    for i in imports:
        own, target = package_of(i.importer), package_of(i.module)
        if own == target:
            continue
        where = f"{i.importer}:{i.line}: {i.module}"
        if target not in MAY_IMPORT[own]:
            found.append(f"{where}: {own} may not import {target}")
            continue
        if i.module != f"ibe_pubsub.{target}" or i.name is None:
            found.append(f"{where}: import from the package's face, not its modules")
            continue
        exports = faces.setdefault(target, face_exports(target))
        if i.name not in exports:
            found.append(f"{where}: {i.name} is not in {target}.__all__")
        elif (own in LIMITED_TO_THE_CLIENT and target == "keyserver"
              and exports[i.name] not in KEY_SERVER_CLIENT):
            found.append(f"{where}: {own} may use only the key server's client, "
                         f"not {exports[i.name]}.{i.name}")
    return found


def cycles(imports: list[Import]) -> list[list[str]]:
    """Import cycles between modules, a name of a face counted as its defining module
    (imports for type checking only do not run, so they do not count)."""
    faces = {p: face_exports(p) for p in PACKAGES if p != "migrations"}
    graph: dict[str, set[str]] = {}
    for i in imports:
        if i.typing_only:
            continue
        target, package = i.module, package_of(i.module)
        if target == f"ibe_pubsub.{package}" and i.name:
            if (REPO_ROOT / package / f"{i.name}.py").exists():
                target = f"{target}.{i.name}"  # a module, imported from its package
            elif faces.get(package, {}).get(i.name):
                target = f"{target}.{faces[package][i.name]}"
        if target != i.importer:
            graph.setdefault(i.importer, set()).add(target)
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for nxt in sorted(graph.get(module, ())):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt):], nxt] if nxt in path else [module, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_every_package_keeps_to_its_layer_and_imports_only_faces():
    imports = project_imports()
    assert len(imports) > 500  # the scan sees the project
    assert violations(imports) == []


def test_no_module_imports_itself_back():
    assert cycles(project_imports()) == []


# -- controls: the checks above catch what they look for ----------------------------------------

def _imports(importer: str, source: str, is_package: bool = False) -> list[Import]:
    return [i for i in imports_of(importer, source, is_package)
            if i.module.startswith("ibe_pubsub.")]


def test_the_check_catches_an_arrow_up_the_layers_and_a_way_around_a_face():
    up = _imports("ibe_pubsub.credentials.schema", "from ibe_pubsub.peer import PeerNode")
    around = _imports("ibe_pubsub.peer.node", "from ibe_pubsub.overlay.machine import X")
    unexported = _imports("ibe_pubsub.peer.node", "from ibe_pubsub.overlay import _secret")
    server_side = _imports("ibe_pubsub.peer.node", "from ibe_pubsub.keyserver import serve")
    client = _imports("ibe_pubsub.peer.node", "from ibe_pubsub.keyserver import KeyServerClient")
    whole = _imports("ibe_pubsub.credentials.schema", "from ibe_pubsub import peer")
    relative = _imports("ibe_pubsub.credentials.schema", "from ..peer.node import PeerNode")
    relative_in_init = _imports("ibe_pubsub.credentials", "from ..overlay import machine", True)
    [a], [b], [c], [d], [e], [f], [g] = (violations(x) for x in (
        up, around, unexported, server_side, whole, relative, relative_in_init))
    assert "credentials may not import peer" in a
    assert "face" in b and "not in overlay.__all__" in c and "only the key server's client" in d
    assert "credentials may not import peer" in e and "ibe_pubsub.peer.node" in f
    assert "credentials may not import overlay" in g
    assert violations(client) == []
    own = _imports("ibe_pubsub.credentials.strings", "from .schema import OTHER_CHAR")
    assert [i.module for i in own] == ["ibe_pubsub.credentials.schema"]


def test_the_check_catches_a_cycle_even_through_a_function_level_import():
    imports = _imports("ibe_pubsub.credentials.schema", "def f():\n"
                       "    from ibe_pubsub.credentials.strings import split\n")
    imports += _imports("ibe_pubsub.credentials.strings",
                        "from ibe_pubsub.credentials.schema import Attribute")
    assert cycles(imports) == [["ibe_pubsub.credentials.schema", "ibe_pubsub.credentials.strings",
                                "ibe_pubsub.credentials.schema"]]

