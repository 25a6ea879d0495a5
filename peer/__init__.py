"""The running peer process and the `ibe-pubsub` command line."""
