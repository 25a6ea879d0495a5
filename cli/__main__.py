"""``python -m ibe_pubsub.cli`` runs the ``ibe-pubsub`` command."""

import sys

from ibe_pubsub.cli.main import main

sys.exit(main())
