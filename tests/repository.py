"""Where the repository under test lies (its docs, Dockerfile and pyproject.toml), and
its packages' modules."""

from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

#: The library packages, lowest first, and everything installed under ``ibe_pubsub``.
LIBRARIES = ("credentials", "overlay", "keyserver", "migrations", "pipelines", "peer",
             "client", "bridges")
PACKAGES = (*LIBRARIES, "evaluation", "cli")


def module_name(path: Path) -> str:
    """``ibe_pubsub.PACKAGE.MODULE`` of a file (a package's ``__init__``: the package)."""
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(("ibe_pubsub", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def package_sources(packages: tuple[str, ...] = PACKAGES) -> Iterator[Path]:
    """Every Python file of ``packages``, in a stable order."""
    for package in packages:
        yield from sorted((REPO_ROOT / package).rglob("*.py"))
