"""The threshold set-up's transport in one process, for tests that need members' outcomes
without running servers (the real transport is tested in test_threshold_setup.py)."""

from __future__ import annotations


def drive(members, deliver=None):
    """Hand every published message to every member until nothing moves.
    ``deliver(recipient, sender, round, data)`` may replace what one member gets from
    another: a member that says different things to different members."""
    moved = True
    while moved:
        moved = False
        for member in members:
            for sender, round_name in member.missing():
                data = members[sender - 1].published(round_name)
                if data is None:
                    continue
                if deliver is not None:
                    data = deliver(member.index, sender, round_name, data)
                member.receive(data)
                moved = True
