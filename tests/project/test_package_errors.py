"""The packages' errors: one base per package, which every error it defines and raises
derives from (so one ``except`` clause catches a package's refusals), and every error
survives pickling, as it must to cross a process pool (the key server's issuer workers,
Spark's Python workers)."""

from __future__ import annotations

import ast
import builtins
import importlib
import pickle

import pytest
from repository import PACKAGES, module_name, package_sources

FACES = [p for p in PACKAGES if p != "migrations"]

#: Built-in exceptions a package may raise: a wrong argument type, a case that cannot
#: happen, and two that a protocol names (PEP 562 asks a module's ``__getattr__`` for an
#: AttributeError; the transport's callers treat a closed transport as any closed socket).
BUILTINS_ALLOWED = {"TypeError", "NotImplementedError", "AssertionError"}
BUILTINS_NAMED = {("ibe_pubsub.credentials.faces", "AttributeError"),
                  ("ibe_pubsub.peer.transport", "ConnectionAbortedError")}

#: Arguments for each exception class with its own ``__init__``.
SAMPLES = {
    "ibe_pubsub.credentials.numeric.OutsideCells": ("needs 3 credentials", 3),
    "ibe_pubsub.credentials.policy_regions.OutsidePolicy": (
        "price", "price < 500", "the request reaches above the policy"),
    "ibe_pubsub.credentials.predicates.PredicateError": ("unexpected character '!'", "a ! b", 2),
    "ibe_pubsub.keyserver.client.KeyServerRequestError": (
        422, {"error": {"message": "invalid", "detail": [{"loc": ["body", "x"], "msg": "no"}]}}),
    "ibe_pubsub.keyserver.errors.ApiError": (
        403, "outside the policy", "forbidden", {"attribute": "price"}, {"Retry-After": "1"}),
}


def error_base(package: str) -> type[Exception]:
    face = importlib.import_module(f"ibe_pubsub.{package}")
    [base] = [getattr(face, n) for n in face.__all__ if n.endswith("Error")
              and getattr(face, n).__bases__ == (Exception,)]
    return base


def own_exceptions(package: str) -> dict[str, type[BaseException]]:
    """The public exception classes ``package`` defines, by qualified name."""
    found = {}
    for path in package_sources((package,)):
        if path.stem == "__main__":
            continue  # it runs the command
        module = importlib.import_module(module_name(path))
        for name, value in vars(module).items():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == module.__name__ and not name.startswith("_")):
                found[f"{module.__name__}.{name}"] = value
    return found


def builtin_raises(module: str, source: str) -> list[str]:
    """``module:line name`` of each ``raise`` of a built-in exception outside those allowed."""
    found = []
    raises = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Raise)]
    for node in sorted(raises, key=lambda n: n.lineno):
        if node.exc is None:
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        name = target.id if isinstance(target, ast.Name) else ""
        if (isinstance(getattr(builtins, name, None), type)
                and issubclass(getattr(builtins, name), BaseException)
                and name not in BUILTINS_ALLOWED and (module, name) not in BUILTINS_NAMED):
            found.append(f"{module}:{node.lineno} {name}")
    return found


def round_trips(error: BaseException) -> bool:
    try:
        again = pickle.loads(pickle.dumps(error))
    except TypeError:
        return False
    return (type(again) is type(error) and str(again) == str(error)
            and vars(again) == vars(error))


@pytest.mark.parametrize("package", FACES)
def test_every_face_exports_what_it_names_and_an_error_base(package):
    face = importlib.import_module(f"ibe_pubsub.{package}")
    assert face.__all__ and all(getattr(face, name) is not None for name in face.__all__)
    assert error_base(package).__module__ == f"ibe_pubsub.{package}.exceptions"


@pytest.mark.parametrize("package", FACES)
def test_every_error_of_a_package_is_its_error_base(package):
    base = error_base(package)
    for name, cls in own_exceptions(package).items():
        assert issubclass(cls, base), name


def test_packages_raise_their_own_errors_not_builtin_ones():
    """So that ``except OverlayError`` (or any package's base) catches every refusal of bad
    input or settings; they stay ValueErrors (or RuntimeErrors) where they were."""
    found = []
    for path in package_sources():
        found += builtin_raises(module_name(path), path.read_text())
    assert found == []


def test_every_exception_survives_pickling():
    classes = {n: c for package in FACES for n, c in own_exceptions(package).items()}
    assert len(classes) > 40  # the scan sees the packages
    custom = {name for name, cls in classes.items()
              if any("__init__" in vars(c) for c in cls.__mro__
                     if c.__module__.startswith("ibe_pubsub."))}
    assert custom == set(SAMPLES), "give each new exception with its own __init__ a sample"
    for name, cls in classes.items():
        assert round_trips(cls(*SAMPLES.get(name, ("a message",)))), name


# -- controls: the checks above catch what they look for ----------------------------------------

def test_the_raise_check_catches_a_builtin_error_and_allows_what_it_names():
    source = """
def f(x):
    if x is None:
        raise TypeError("x")
    if x < 0:
        raise ValueError(f"{x} < 0")
    if x > 9:
        raise RuntimeError
    raise AttributeError(x)
"""
    assert builtin_raises("ibe_pubsub.overlay.config", source) == [
        "ibe_pubsub.overlay.config:6 ValueError", "ibe_pubsub.overlay.config:8 RuntimeError",
        "ibe_pubsub.overlay.config:9 AttributeError"]
    assert builtin_raises("ibe_pubsub.credentials.faces", source)[-1].endswith("RuntimeError")


class Refusal(Exception):
    """An exception with its own arguments and no ``__reduce__``, as the control needs."""

    def __init__(self, status: int, reason: str) -> None:
        self.status, self.reason = status, reason
        super().__init__(f"{status}: {reason}")


class PicklableRefusal(Refusal):
    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return type(self), (self.status, self.reason)


def test_control_an_exception_with_its_own_arguments_needs_reduce():
    assert not round_trips(Refusal(403, "no"))
    assert round_trips(PicklableRefusal(403, "no"))
