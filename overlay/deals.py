"""Multi-credential routing's deal: which parents hold which of a virtual peer's fine
tokens.

A parent forwards an event to a child only if a token the child dealt it routes the
event, so the deal decides both what each parent learns (the fine credentials of its
tokens) and which paths an event has. Each token goes to ``copies`` parents on different
physical peers (two with push backups, so one dropping holder is not enough to cut a
token off). The deal is balanced, so that no parent sits idle while another holds more
than its share, and stable, because every move opens a window in which an event in flight
meets neither its old route nor its new one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ibe_pubsub.overlay.virtual import Node


def deal_tokens(groups: Sequence[int], parents: Sequence[Node],
                held: Mapping[Node, set[int]], copies: int) -> dict[Node, set[int]]:
    """The token groups each parent holds next, given what each ``held`` before.

    Every group gets ``min(copies, len(parents))`` holders, each parent at least one group
    when there are enough (a parent dealt nothing would be told it has no tokens yet, and
    forward everything), and no parent more than its share of
    ``max(len(groups) * copies, len(parents))`` slots unless distinct holders leave no
    other choice. Holdings are kept first, one holder per group before any group keeps
    two, so that of two parents over their share each keeps a different group. The fill
    is greedy: of 215,822 deals along random joins and leaves (2 to 5 tokens, 2 copies)
    5 left two parents more than one token apart.
    """
    if not groups:  # (keys of no valid epoch left: nothing to deal)
        return {p: set() for p in parents}
    copies = min(copies, len(parents))
    base, extra = divmod(max(len(groups) * copies, len(parents)), len(parents))
    # The extra slots go to the parents that hold the most already: they move the least.
    ranked = sorted(parents, key=lambda p: -len(held.get(p, ())))
    quota = {p: base + (i < extra) for i, p in enumerate(ranked)}
    out: dict[Node, set[int]] = {p: set() for p in parents}
    holders: dict[int, list[Node]] = {g: [] for g in groups}

    def fits(p: Node, g: int, within_quota: bool = True) -> bool:
        return (g not in out[p] and all(p[0] != h[0] for h in holders[g])
                and (not within_quota or len(out[p]) < quota[p]))

    def give(p: Node, g: int) -> None:
        out[p].add(g)
        holders[g].append(p)

    for round_ in range(copies):
        for g in groups:
            keeper = next((p for p in parents if len(holders[g]) == round_
                           and g in held.get(p, ()) and fits(p, g)), None)
            if keeper is not None:
                give(keeper, g)
    while short := [g for g in groups if len(holders[g]) < copies]:
        # The group with the fewest parents left that fit it first, so that a parent
        # with room goes to the group that has no other choice.
        choices = {g: [p for p in parents if fits(p, g)] for g in short}
        g = min(short, key=lambda g: len(choices[g]) or len(parents) + 1)
        candidates = (choices[g] or [p for p in parents if fits(p, g, within_quota=False)]
                      or [p for p in parents if g not in out[p]])
        # The least loaded, and of those the one fewest other short groups could take.
        give(min(candidates, key=lambda p: (len(out[p]), sum(
            p in choices[h] for h in short if h != g))), g)
    for p in parents:
        if not out[p]:  # more parents than slots: a further copy of the rarest group
            give(p, min(groups, key=lambda g: len(holders[g])))
    return out
