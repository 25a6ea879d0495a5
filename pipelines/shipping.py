"""Our code for a cluster's Python workers: the project's packages the job imports, in a zip.

Executors on other machines have pyspark, pyarrow and pandas installed, but not this
project (and must not depend on the driver's working tree, which they cannot see). The
driver therefore zips the project's top-level packages it has loaded once the job's
modules are imported, found from the modules themselves rather than from a list of names:
a package counts as the project's when it lies in the directory that holds this package
and belongs to the same distribution (or, run from a source checkout, to none). The zip
goes to the workers through ``SparkContext.addPyFile``, or over Spark Connect as a
``pyfile`` artifact; either way the workers put it first on their ``sys.path``.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

# What the executors run: the functions of these modules are pickled by reference.
JOB_MODULES = ("pipelines.spark_job",)
ARCHIVE_NAME = "ibe_pubsub_packages.zip"


def _top(name: str) -> str:
    return name.partition(".")[0]


def project_packages() -> dict[str, list[Path]]:
    """The directories of each top-level package of the project that this process has
    loaded, by name, after importing ``JOB_MODULES``."""
    for module in JOB_MODULES:
        importlib.import_module(module)
    ours = _top(__name__)
    owners = packages_distributions()
    home = {Path(path).parent for path in sys.modules[ours].__path__}
    found: dict[str, list[Path]] = {}
    for name in sorted({_top(loaded) for loaded in list(sys.modules)}):
        paths = [Path(path) for path in getattr(sys.modules.get(name), "__path__", ())]
        if paths and {p.parent for p in paths} <= home and owners.get(name) == owners.get(ours):
            found[name] = paths
    return found


def package_archive(directory: Path | None = None) -> Path:
    """Zip ``project_packages()`` (every file but compiled bytecode) into ``directory``
    (default: a new temporary one), paths relative to the directory holding each package,
    as ``sys.path`` expects."""
    archive = Path(directory or tempfile.mkdtemp(prefix="ibe-pubsub-")) / ARCHIVE_NAME
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for paths in project_packages().values():
            for package in paths:
                for path in sorted(package.rglob("*")):
                    if path.is_file() and "__pycache__" not in path.relative_to(package).parts:
                        zf.write(path, path.relative_to(package.parent))
    return archive
