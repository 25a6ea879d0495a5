"""The overlay protocol as a sans-I/O state machine, and a simulator that drives it."""
