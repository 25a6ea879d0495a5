"""Our code for a cluster's Python workers: the project's packages the job imports, in a zip.

Executors on other machines have pyspark, pyarrow and pandas installed, but not this
project (and must not depend on the driver's working tree, which they cannot see). The
driver therefore zips the project's packages (``ibe_pubsub.*``) that it has loaded once the
job's modules are imported, found from the modules themselves rather than from a list of
names, and stored under ``ibe_pubsub/`` whatever folder each comes from (a wheel, an
editable install or a source checkout). The zip goes to the workers through
``SparkContext.addPyFile``, or over Spark Connect as a ``pyfile`` artifact; either way the
workers put it first on their ``sys.path``, where ``ibe_pubsub`` is a namespace package.
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

# What the executors run: the functions of these modules are pickled by reference.
JOB_MODULES = ("ibe_pubsub.pipelines.spark_job",)
ARCHIVE_NAME = "ibe_pubsub_packages.zip"
NAMESPACE = __name__.partition(".")[0]


def project_packages() -> dict[str, list[Path]]:
    """The directories of each package of the project (``ibe_pubsub.NAME``) that this
    process has loaded, by name, after importing ``JOB_MODULES``."""
    for module in JOB_MODULES:
        importlib.import_module(module)
    found: dict[str, list[Path]] = {}
    for name, module in sorted(sys.modules.items()):
        namespace, _, rest = name.partition(".")
        if namespace == NAMESPACE and rest and "." not in rest:
            found[name] = [Path(path) for path in getattr(module, "__path__", ())]
    return found


def package_archive(directory: Path | None = None) -> Path:
    """Zip ``project_packages()`` (every file but compiled bytecode) into ``directory``
    (default: a new temporary one, removed when this process exits: Spark has its own copy
    by then) as ``ibe_pubsub/NAME/...``, as ``sys.path`` expects."""
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="ibe-pubsub-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    archive = directory / ARCHIVE_NAME
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        # zipimport finds a namespace package only through its directory's own entry.
        zf.mkdir(NAMESPACE)
        for name, paths in project_packages().items():
            target = Path(*name.split("."))
            for package in paths:
                for path in sorted(package.rglob("*")):
                    relative = path.relative_to(package)
                    if path.is_file() and "__pycache__" not in relative.parts:
                        zf.write(path, target / relative)
    return archive
