"""Who was below whom during a soak run: the trees rebuilt from the peers' own logs, so
that a fault excuses only the misses of the subscribers it could cut off.

Every peer logs each link its virtual peers make (``price tree: virtual peer 5c77…
linked to 10.213.0.1:41505 (link 1) in 0.094 s``, at ``-v``). A subscriber's ancestors
in a tree at a moment are found by following, from its virtual peers in that tree, the
parents they had linked to by then, to the processes listening at those addresses, and
on up. A virtual peer's last two links count as its parents (its two parents, or one and
the one just replaced): generous, so that a fault never gets blamed on a subscriber it
could have reached; a miss by a subscriber none of whose ancestors the fault touched is
a loss. (Under MCR a virtual peer with ``k`` fine tokens wants up to ``2k`` parents;
where it has more than two, counting the last two is stricter, not more generous.)
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

LINKED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO ibe_pubsub\.peer\.node: "
                    r"(\S+) tree: virtual peer (\S+) linked to (\S+) \(link", re.MULTILINE)
#: Links of a virtual peer that count as its parents at a time (see the module docstring).
PARENTS_KEPT = 2


def read_links(log: Path) -> list[tuple[float, str, str, str]]:
    """``(time, tree, virtual peer, parent address)`` of every link a peer's log records
    (log times are local wall-clock times, as :mod:`logging` writes them)."""
    if not log.exists():
        return []
    out = []
    for match in LINKED.finditer(log.read_text(errors="replace")):
        when = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((when, match[2], match[3], match[4]))
    return out


class Trees:
    """The links of a run (``links``: per peer name, as :func:`read_links` gives them) and
    the addresses its processes listened at (``addresses``: address -> peer name)."""

    def __init__(self, links: dict[str, list[Any]], addresses: dict[str, str]) -> None:
        self.addresses = addresses
        #: (peer, tree) -> virtual peer -> sorted (time, parent address)
        self._links: dict[tuple[str, str], dict[str, list[tuple[float, str]]]] = \
            defaultdict(lambda: defaultdict(list))
        for name, rows in links.items():
            for when, tree, vp, parent in rows:
                self._links[(name, tree)][vp].append((when, parent))
        for per_vp in self._links.values():
            for rows in per_vp.values():
                rows.sort()
        self._trees = sorted({tree for _, tree in self._links})

    def parents(self, name: str, tree: str, at: float) -> set[str]:
        """The peers ``name``'s virtual peers in ``tree`` had as parents at ``at``."""
        out = set()
        for rows in self._links.get((name, tree), {}).values():
            k = bisect_right(rows, (at, "\uffff"))
            out |= {self.addresses.get(a, a) for _, a in rows[max(0, k - PARENTS_KEPT):k]}
        return out

    def ancestors(self, name: str, at: float) -> set[str]:
        """Every peer above ``name`` in any tree at ``at``."""
        found: set[str] = set()
        for tree in self._trees:
            todo = [name]
            seen = {name}
            while todo:
                for parent in self.parents(todo.pop(), tree, at):
                    if parent not in seen:
                        seen.add(parent)
                        found.add(parent)
                        todo.append(parent)
        return found
