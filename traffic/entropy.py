"""Entropy: the UDP source port of each packet, which the switches' ECMP hash reads.

Seeded and reproducible from (seed, flow tag): one port per flow (ecmp), a new one
every packet (spray), or a new one after the flow's wire was idle (flowlet).
"""

from __future__ import annotations

import random
import zlib

from traffic.transport_settings import ENTROPY_MODES

SPORT_MIN, SPORT_MAX = 0xC000, 0xFFFF   # RoCEv2 entropy range: 49152..65535
SPORT_SPAN = SPORT_MAX - SPORT_MIN + 1
SPRAY_TABLE = 4096             # spray cycles through this many seeded random ports


def ecmp_port(seed: int, tag: str) -> int:
    """A flow's fixed source port: a hash of the seed and the flow's tag."""
    return SPORT_MIN + zlib.crc32(f"{seed}:{tag}".encode()) % SPORT_SPAN


class Entropy:
    """UDP source port per packet of one flow, reproducible from (seed, tag).

    ecmp: one port for the whole flow; spray: a new (seeded random) port every packet;
    flowlet: a new port when the flow was idle on the wire for more than `flowlet_gap_us`.
    Idle runs from the end of the previous packet: its `port()` time, unless the sender
    says, with `on_wire_until`, when that packet finishes leaving its NIC queue (a flow
    that keeps its NIC busy is never idle, however bursty its sender's wake-ups).
    `fixed` is the port when it never changes (ecmp), for the agent's fast path.
    """

    def __init__(self, mode: str, seed: int, tag: str, flowlet_gap_us: float = 200.0):
        if mode not in ENTROPY_MODES:
            raise ValueError(f"entropy: {mode!r} is not one of {', '.join(ENTROPY_MODES)}")
        if flowlet_gap_us < 0:
            raise ValueError(f"flowlet_gap_us must be >= 0, got {flowlet_gap_us}")
        self.mode = mode
        self.gap_ns = int(flowlet_gap_us * 1000)
        self.current = ecmp_port(seed, tag)
        self.fixed: int | None = self.current if mode == "ecmp" else None
        self.flowlet = mode == "flowlet"
        # ecmp never draws from it: not built (4096 draws per flow; a 16-rank ring
        # all-reduce of 8 iterations has 480 flows per agent: seconds of start-up)
        rng = random.Random(f"{seed}:{tag}:{mode}")
        self._table = [] if self.fixed is not None else [
            SPORT_MIN + rng.randrange(SPORT_SPAN) for _ in range(SPRAY_TABLE)]
        self._i = 0
        self._last_ns: int | None = None
        self.changes = 0             # flowlet: new ports taken

    def port(self, now_ns: int = 0) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.mode == "spray":
            i = self._i
            self._i = (i + 1) % SPRAY_TABLE
            return self._table[i]
        last, self._last_ns = self._last_ns, now_ns
        if last is not None and now_ns - last > self.gap_ns:
            self.current = self._table[self._i]
            self._i = (self._i + 1) % SPRAY_TABLE
            self.changes += 1
        return self.current

    def on_wire_until(self, end_ns: int) -> None:
        """The packet just given a port leaves the wire at `end_ns` (flowlet mode)."""
        self._last_ns = end_ns
