"""The wheel: built from the files the Dockerfile copies, it adds one top-level name to a
user's environment (``ibe_pubsub``), and an installation from it finds its migrations as
package resources, away from the repository."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from keyserver_fixtures import PASSPHRASE
from repository import REPO_ROOT

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, source)
    for folder in project["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(REPO_ROOT / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "--wheel-dir", str(out), str(source)],
                           timeout=120, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    [wheel] = out.glob("ibe_pubsub-*.whl")
    return wheel


def test_the_wheel_installs_one_namespace(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ibe_pubsub", wheel.name.split("-py3")[0]
                                                 + ".dist-info"}
    assert "ibe_pubsub/__init__.py" not in names  # a namespace package
    packages = {n.split("/")[1] for n in names if n.startswith("ibe_pubsub/")}
    assert packages == {"bridges", "cli", "client", "credentials", "evaluation", "keyserver",
                        "migrations", "overlay", "peer", "pipelines"}
    for resource in ("ibe_pubsub/migrations/script.py.mako", "ibe_pubsub/credentials/stocks.toml",
                     "ibe_pubsub/migrations/versions/0001_initial.py"):
        assert resource in names
    [entry_points] = [n for n in names if n.endswith("entry_points.txt")]
    assert "ibe-pubsub = ibe_pubsub.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_an_installed_wheel_migrates_a_new_key_store_from_its_own_files(wheel: Path,
                                                                        tmp_path: Path):
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-index", "--target", str(target), str(wheel)],
                   check=True, timeout=120, capture_output=True)
    # -S: no site-packages processing, so the development install cannot serve ibe_pubsub;
    # the dependencies come from this environment's site-packages, put after the wheel's.
    sites = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    script = (
        "import os, sys; sys.path[:0] = [sys.argv[1], *sys.argv[2].split(os.pathsep)]\n"
        "import ibe_pubsub.keyserver.migrate as m\n"
        "print(m.MIGRATIONS)\n"
        "from ibe_pubsub.cli import main\n"
        "sys.exit(main(['keyserver', 'init', '--data', sys.argv[3], '--schema', 'stocks']))\n")
    data = tmp_path / "ks"
    done = subprocess.run(
        [sys.executable, "-S", "-c", script, str(target), sites, str(data)],
        env={"IBE_PUBSUB_PASSPHRASE": PASSPHRASE, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(target / "ibe_pubsub" / "migrations")
    heads = sorted(p.stem.split("_")[0] for p in
                   (target / "ibe_pubsub" / "migrations" / "versions").glob("0*.py"))
    with sqlite3.connect(data / "keyserver.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()[0] == heads[-1]
