"""Package faces whose names import their modules on first use (PEP 562).

Each package's ``__init__`` names its public API, as ``h11`` does, and other packages
import only those names. Importing every module eagerly would make each face as heavy as
its whole package (the key server's web stack, Spark's client, the pairing library) for a
caller that needs one function, so a name's module is imported when the name is first read.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__`` and the module's ``__getattr__`` and ``__dir__`` (so ``dir()``, ``help()``
    and completion list the names) for ``package`` from ``{module: names}``, where a name
    equal to its module's name exports the module itself."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(f"{package}.{module}")
        value = loaded if name == module else getattr(loaded, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return sorted(where), __getattr__, __dir__
