"""A threshold deployment (docs/scheme.md, section 16) with every server in this process,
for benchmarks and tests only: it runs the four key generations and the ``beta``
ceremony by handing each server's messages to the others directly, so this one process
ends up with every server's secret shares, which a real deployment never allows."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ibe_pubsub.credentials import (
    G2,
    DkgResult,
    PairingGroup,
    Participant,
    beta_step,
    check_beta_step,
    initial_beta_state,
)
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver import (
    DEFAULT_EPOCH_SECONDS,
    Member,
    SetupMember,
    SetupPlan,
    create_member_key,
    load_member_key,
    raw_public_key,
    save_setup,
)

Deliver = Callable[[int, int, str, bytes], bytes]


def _key_generation(group: PairingGroup, t: int, n: int, zero: bool = False
                    ) -> list[DkgResult]:
    """Every server honest: dealings, shares, no complaints, results."""
    participants = [Participant(group, i, t, n, zero) for i in range(1, n + 1)]
    for dealer in participants:
        dealing, shares = dealer.dealing()
        for p in participants:
            p.receive(dealer.index, dealing)
            p.receive_share(dealer.index, shares[p.index])
    return [p.finish() for p in participants]


def local_deployment(group: PairingGroup, t: int, n: int, deployment: bytes
                     ) -> tuple[T.ThresholdPublicKey, dict[int, T.ServerSecrets]]:
    """The public key and every server's secrets of a fresh ``t``-of-``n`` deployment."""
    delta, phi, x = (_key_generation(group, t, n) for _ in range(3))
    rho = _key_generation(group, t, n, zero=True)
    g2 = T.derive_g2(group, deployment)
    state = initial_beta_state(g2, group.generator(G2))
    for server in range(1, n + 1):
        state = check_beta_step(group, deployment, g2, state,
                                beta_step(group, deployment, server, state), server)
    tpk = T.assemble_public_key(group, deployment, t, n, state, delta[0].public_key,
                                delta[0].public_shares, phi[0].public_key,
                                phi[0].public_shares, x[0].public_key, x[0].public_shares,
                                rho[0].public_shares)
    return tpk, {i: T.ServerSecrets(i, delta[i - 1].share, phi[i - 1].share,
                                    x[i - 1].share, rho[i - 1].share, os.urandom(32))
                 for i in range(1, n + 1)}


def drive(members: Sequence[SetupMember], deliver: Deliver | None = None) -> None:
    """The set-up's transport in one process: hand every published message to every member
    until nothing moves. ``deliver(recipient, sender, round, data)`` may replace what one
    member gets from another (a member that says different things to different members)."""
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


def write_local_setup(group: PairingGroup, data_dirs: Sequence[Path], urls: Sequence[str],
                      passphrase: str, deployment: str, t: int,
                      epoch_seconds: int = DEFAULT_EPOCH_SECONDS) -> None:
    """The set-up among members at ``urls``, run here and written to each data directory
    as ``keyserver threshold-key`` and ``keyserver threshold-setup`` write it (a fresh
    member key each, sealed there, and the outcome)."""
    for data_dir in data_dirs:
        create_member_key(data_dir, passphrase)
    keys = [load_member_key(data_dir, passphrase) for data_dir in data_dirs]
    plan = SetupPlan(deployment, t, tuple(Member(url, raw_public_key(k))
                                          for url, k in zip(urls, keys, strict=True)),
                     epoch_seconds)
    members = [SetupMember(group, plan, k) for k in keys]
    drive(members)
    for data_dir, member in zip(data_dirs, members, strict=True):
        assert member.result is not None, "a local set-up among honest members finishes"
        save_setup(data_dir, passphrase, plan, member.result)
