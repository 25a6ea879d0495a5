"""The key server: the one trusted party that issues credential keys over HTTP."""
