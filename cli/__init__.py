"""The ``ibe-pubsub`` command: one module per command group, and the argument helpers they
share. Only this package and :mod:`ibe_pubsub.evaluation` sit on top of the libraries; no
library package imports it."""

from ibe_pubsub.cli.app import main
from ibe_pubsub.cli.exceptions import CliError

__all__ = ["CliError", "main"]
