"""A call that keeps failing (a peer's directory renewal while its key server is down) is
retried less and less often and reported rarely."""

from __future__ import annotations

from ibe_pubsub.peer.retry import Backoff


def test_backoff_doubles_to_a_ceiling_reports_rarely_and_resets_on_success():
    said: list[str] = []
    backoff = Backoff("directory renewal", said.append)
    now, delays = 0.0, []
    while now < 15 * 60:  # a quarter of an hour of "connection refused"
        delays.append(backoff.failed(now, "connection refused"))
        now += delays[-1]
    assert delays[:7] == [2, 4, 8, 16, 32, 60, 60]
    assert set(delays[5:]) == {60}
    # 2 s apart, as before, that would have been 450 lines; now one a minute at most
    assert len(said) <= 16, said
    assert said[0] == "directory renewal failed: connection refused; next attempt in 2 s"
    assert said[1] == ("directory renewal failed (5 failures since the last report): "
                       "connection refused; next attempt in 60 s")
    assert sum(int(line.split("(")[1].split()[0]) if "since" in line else 1
               for line in said) == len(delays)  # every failure is counted once

    said.clear()
    backoff.succeeded()
    assert said == [f"directory renewal works again after {len(delays)} failed attempt(s)"]
    backoff.succeeded()  # the control: nothing to say while it keeps working
    assert len(said) == 1
    assert backoff.failed(now, "timed out") == 2  # a new outage starts over
    assert said[-1] == "directory renewal failed: timed out; next attempt in 2 s"
