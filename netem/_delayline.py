"""Userspace delay line: holds packets queued by netfilter's NFQUEUE target and releases them late.

Used by the ``fallback`` shaping backend on kernels without the netem qdisc. An iptables rule
(``-j NFQUEUE --queue-num N``) hands every packet of one direction of a link to queue ``N``; this
process, bound to that queue in the link's network namespace, keeps each packet's verdict back
for ``delay_ms`` plus a uniform jitter in ``[-jitter_ms, +jitter_ms]`` and then accepts it.

Semantics (compared with netem, ``tc-netem(8)``):

* Order is kept: a packet is never released before the one queued ahead of it, so jitter does not
  reorder (netem with jitter reorders unless a rate is set). ``reorder_pct`` of the packets are
  released at once, without the delay, which is netem's ``reorder`` behaviour (``tc-netem(8)``:
  "a percentage of packets are sent immediately, the rest are delayed").
* The kernel holds the packets; only their ids cross into userspace (``NFQNL_COPY_META``), so
  the cost per packet is one netlink message each way.

The delay line is a separate process (``python -m netem._delayline``), not a thread of the
harness, so the harness's GIL load cannot stretch the delay. It exits on SIGTERM/SIGINT, and by
itself when its parent process dies (a SIGKILLed harness leaves no delay line running for long).
Its command line carries ``--tag`` (a ``zw-`` name) so ``netem clean`` can find leftovers.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import select
import signal
import socket
import sys
import time
from typing import Any

# How often (s) the process checks that its parent is still alive.
_PARENT_CHECK_S = 0.5
# Kernel queue length (packets); packets beyond it are dropped by the kernel (NFQUEUE without
# --queue-bypass), as a full netem queue (default limit 1000) drops them.
QUEUE_MAXLEN = 10000
# Receive buffer for the netlink socket: deep enough for a burst of QUEUE_MAXLEN metadata messages.
_SOCK_RCVBUF = 8 * 1024 * 1024


class DelayLine:
    """Release time bookkeeping, independent of netlink so it can be reasoned about alone.

    ``due(now)`` returns the release time (``time.monotonic()`` seconds) of a packet arriving at
    ``now``: ``now + delay + U(-jitter, +jitter)``, never earlier than the previous packet's release
    (order is kept), and ``now`` itself for the ``reorder_pct`` share of packets.
    """

    def __init__(
        self, delay_ms: float, jitter_ms: float, reorder_pct: float, seed: int | None = None
    ) -> None:
        self.delay_s = delay_ms / 1000.0
        self.jitter_s = jitter_ms / 1000.0
        self.reorder = reorder_pct / 100.0
        self._rng = random.Random(seed)
        self._last_due = 0.0

    def due(self, now: float) -> float:
        if self.reorder and self._rng.random() < self.reorder:
            return now
        d = self.delay_s
        if self.jitter_s:
            d += self._rng.uniform(-self.jitter_s, self.jitter_s)
        t = max(now + max(d, 0.0), self._last_due)
        self._last_due = t
        return t


def _bind(first_queue: int, callback: Any, tries: int = 64) -> tuple[Any, int]:
    """Bind the first free queue number from ``first_queue`` on; returns (queue, number)."""
    from netfilterqueue import COPY_META, NetfilterQueue

    last: OSError | None = None
    for num in range(first_queue, first_queue + tries):
        nfq = NetfilterQueue()
        try:
            nfq.bind(num, callback, max_len=QUEUE_MAXLEN, mode=COPY_META, range=0,
                     sock_len=_SOCK_RCVBUF)
        except OSError as e:  # queue number taken by another process in this namespace
            last = e
            continue
        return nfq, num
    raise OSError(f"no free NFQUEUE number in {first_queue}..{first_queue + tries - 1}: {last}")


def _raise_priority() -> None:
    """Keep a loaded machine's scheduling noise out of the delay.

    SCHED_FIFO at the lowest real-time priority: the line sleeps in select() between packets, so
    it costs little CPU, but it is woken ahead of ordinary processes (measured here with four
    busy-looping processes on two cores: kernel RTT 100.3-101.8 ms for a 100 ms line at nice
    -10, see the shaping tests). The kernel's RT throttling (sched_rt_runtime_us) still bounds
    it. Falls back to nice -10, then to nothing, without privileges.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        return
    except (OSError, AttributeError):
        pass
    try:
        os.nice(-10)
    except OSError:
        pass


def serve(args: argparse.Namespace) -> int:
    line = DelayLine(args.delay_ms, args.jitter_ms, args.reorder_pct, args.seed)
    pending: list[tuple[float, int, Any]] = []
    seq = 0

    def on_packet(pkt: Any) -> None:
        nonlocal seq
        now = time.monotonic()
        t = line.due(now)
        if t <= now:
            pkt.accept()
            return
        seq += 1
        heapq.heappush(pending, (t, seq, pkt))

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _raise_priority()

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rcvbuf capped by net.core.rmem_max
        nfq, num = _bind(args.queue, on_packet)
    fd = nfq.get_fd()
    os.set_blocking(fd, False)
    sock = socket.fromfd(fd, socket.AF_NETLINK, socket.SOCK_RAW)
    parent = os.getppid()
    print(f"READY {num}", flush=True)
    # From here on nobody reads the pipe the launcher gave us: send output to the log (or
    # nowhere) so a burst of messages can never block the line on a full pipe.
    out = os.open(args.log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    next_parent_check = time.monotonic() + _PARENT_CHECK_S
    try:
        while not stop:
            now = time.monotonic()
            while pending and pending[0][0] <= now:
                heapq.heappop(pending)[2].accept()
            if now >= next_parent_check:
                if os.getppid() != parent:
                    break
                next_parent_check = now + _PARENT_CHECK_S
            timeout = next_parent_check - now
            if pending:
                timeout = min(timeout, pending[0][0] - now)
            try:
                ready, _, _ = select.select([sock], [], [], max(timeout, 0.0))
            except InterruptedError:
                continue
            if ready:
                nfq.run(block=False)
    finally:
        # Release what is still held rather than dropping it, then leave the queue.
        for _, _, pkt in pending:
            try:
                pkt.accept()
            except Exception:  # noqa: BLE001 - the queue may already be gone
                pass
        nfq.unbind()
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netem._delayline", description=__doc__)
    p.add_argument("--queue", type=int, required=True, help="first NFQUEUE number to try")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--reorder-pct", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tag", required=True, help="zw- name of the shaping this line belongs to")
    p.add_argument("--log", default=None, help="file for messages after start-up")
    args = p.parse_args(argv)
    try:
        return serve(args)
    except OSError as e:
        print(f"ERROR {e}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
