"""`python -m peer` runs the `ibe-pubsub` command (one copy of the dispatcher module)."""

import sys

from peer.cli import main

sys.exit(main())
