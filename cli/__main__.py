"""``python -m ibe_pubsub.cli`` runs the ``ibe-pubsub`` command."""

import sys

from ibe_pubsub.cli.app import main

sys.exit(main())
