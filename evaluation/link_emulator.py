"""A link emulator for the network-namespace part of ``bench soak``: delay, loss and
partitions on the packets an ``iptables ... -j NFQUEUE`` rule hands to user space.

``tc netem`` is the usual tool, but many kernels (containers, minimal cloud images) are
built without ``sch_netem``, while netfilter's queue is nearly always there. This process
binds one queue over a raw netlink socket (``NETLINK_NETFILTER``, the ``nfnetlink_queue``
messages of ``linux/netfilter/nfnetlink_queue.h``), and answers each queued packet with a
verdict: accept after ``--delay-ms``, drop with probability ``--loss``, and drop every
packet that arrives while partitioned (SIGUSR1 cuts the link, SIGUSR2 heals it; packets
already held when it is cut are still let through). The packets never
leave the kernel, so checksum and segmentation offloads need no care; a packet is released
in the order it arrived, so a constant delay reorders nothing.

Run it in the namespace whose rules queue the packets (``ip netns exec NAME python -m
ibe_pubsub.evaluation.link_emulator --queue 0 --delay-ms 20 --loss 0.01``).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator

from ibe_pubsub.evaluation.exceptions import NetworkLabError

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
PR_SET_PDEATHSIG = 1
#: Packets the kernel holds for us at most (the delay times the packet rate must fit).
QUEUE_LENGTH = 16384


def _attribute(kind: int, data: bytes) -> bytes:
    padding = b"\0" * (-len(data) % 4)
    return struct.pack("=HH", 4 + len(data), kind) + data + padding


def _message(kind: int, queue: int, attributes: bytes, flags: int = NLM_F_REQUEST,
             seq: int = 0) -> bytes:
    """A netlink message of the queue subsystem: ``nlmsghdr``, ``nfgenmsg`` (AF_UNSPEC,
    version 0, the queue number big-endian), then the attributes."""
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attributes
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags,
                       seq, 0) + body


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each netlink message in one datagram."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        yield kind, data[offset + 16:offset + length]
        offset += (length + 3) & ~3


def _attributes(payload: bytes) -> dict[int, bytes]:
    out, offset = {}, 0
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = payload[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return out


class LinkEmulator:
    """One bound queue and the packets it holds until their time."""

    def __init__(self, queue: int, delay: float, loss: float, seed: int) -> None:
        self.queue, self.delay, self.loss = queue, delay, loss
        self.rng = random.Random(seed)
        self.partitioned = False
        self.held: collections.deque[tuple[float, int]] = collections.deque()
        self.counts = collections.Counter[str]()
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        # A burst the process is too slow for must not end it: overrun messages are lost
        # (their packets stay queued until the queue's own limit drops new ones).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._configure(_attribute(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0,
                                                             socket.htons(socket.AF_INET))))
        self._configure(_attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                        + _attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_LENGTH)))

    def _configure(self, attributes: bytes) -> None:
        """Send one configuration message and wait for the kernel's acknowledgement."""
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attributes,
                                NLM_F_REQUEST | NLM_F_ACK))
        while True:
            for kind, payload in _messages(self.sock.recv(65536)):
                if kind == NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", payload)
                    if error:
                        raise NetworkLabError(-error, f"binding netfilter queue {self.queue}")
                    return

    def _verdict(self, packet_id: int, verdict: int) -> None:
        self.sock.send(_message(NFQNL_MSG_VERDICT, self.queue,
                                _attribute(NFQA_VERDICT_HDR, struct.pack("!II", verdict,
                                                                         packet_id))))

    def receive(self) -> None:
        """Take the queued packets the kernel sent: drop or hold each."""
        data = self.sock.recv(1 << 20)
        now = time.monotonic()
        for kind, payload in _messages(data):
            if kind != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                continue
            header = _attributes(payload[4:]).get(NFQA_PACKET_HDR)
            if header is None:
                continue
            (packet_id,) = struct.unpack_from("!I", header)
            if self.partitioned or self.rng.random() < self.loss:
                self.counts["partitioned" if self.partitioned else "lost"] += 1
                self._verdict(packet_id, NF_DROP)
            else:
                self.held.append((now + self.delay, packet_id))

    def release(self) -> float | None:
        """Accept the packets whose delay is over; seconds until the next one is due."""
        now = time.monotonic()
        while self.held and self.held[0][0] <= now:
            self._verdict(self.held.popleft()[1], NF_ACCEPT)
            self.counts["delivered"] += 1
        return self.held[0][0] - now if self.held else None

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        while True:
            wait = self.release()
            if selector.select(wait):
                self.receive()

    def set_partitioned(self, partitioned: bool) -> None:
        self.partitioned = partitioned
        self.report("partitioned" if partitioned else "healed")

    def report(self, what: str) -> None:
        """A log line with the packets counted so far, as JSON after "so far "."""
        print(f"link: {what}; so far {json.dumps(self.counts)}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self.report("stopped")
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ibe_pubsub.evaluation.link_emulator",
        description="Delay, lose or cut the packets of one netfilter queue (iptables -j "
                    "NFQUEUE); SIGUSR1 cuts the link, SIGUSR2 heals it. Needs root (or "
                    "CAP_NET_ADMIN) in the namespace of the queueing rules.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--queue", type=int, default=0, help="netfilter queue number")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="delay added to every packet (milliseconds)")
    parser.add_argument("--loss", type=float, default=0.01,
                        help="probability that a packet is dropped")
    parser.add_argument("--seed", type=int, default=1, help="seed of the losses")
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or not 0 <= args.loss < 1:
        parser.error("--delay-ms must be >= 0 and --loss in [0, 1)")
    # Ends with the process that started it, even one killed without cleaning up.
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        return 0
    try:
        link = LinkEmulator(args.queue, args.delay_ms / 1000, args.loss, args.seed)
    except OSError as exc:
        print(f"link emulator: cannot bind netfilter queue {args.queue}: {exc}",
              file=sys.stderr)
        return 1
    signal.signal(signal.SIGUSR1, lambda *_: link.set_partitioned(True))
    signal.signal(signal.SIGUSR2, lambda *_: link.set_partitioned(False))
    signal.signal(signal.SIGTERM, lambda *_: link.stop())
    print(f"link: queue {args.queue}, delay {args.delay_ms:g} ms, loss {args.loss:g}",
          file=sys.stderr, flush=True)
    link.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
