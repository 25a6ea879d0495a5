"""Where the repository under test lies (its docs, Dockerfile and pyproject.toml)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
