"""The fabric's shaping timers over a run: how late the kernel fired them, and the wire
time that cost the shaped ports, as a share of those ports' busy time.

fabric.shaping_timers counts every qdisc watchdog firing and how late it was. A firing
later than its port's burst time loses the port `late - burst` of wire time while
frames wait in its queue: the send side's counterpart of an agent that left its wire
idle (testbed.fidelity), which the agents cannot see since their queue was not empty.
The burst used is the shortest of the fabric's ports (an upper bound on the loss for
the slower ones); busy time is each port's bytes sent over its rate (links.csv).
"""

from __future__ import annotations

from fabric.shaping import burst_s
from fabric.shaping_timers import ShapingTimers, TimersUnavailableError, summarize

MECHANISM = "eBPF on the timer tracepoints (hrtimer_start, hrtimer_expire_entry)"


def tolerance_s(topo) -> float:
    """The shortest burst time among the fabric's links (each port's HTB burst)."""
    return min(burst_s(d["rate_mbps"]) for _, _, d in topo.graph.edges(data=True))


def busy_s(topo, totals: dict) -> float:
    """Seconds the fabric's ports spent sending: bytes over each port's link rate."""
    busy = 0.0
    for (node, ifname), t in totals.items():
        peer = topo.peer(node, ifname)
        busy += t["tx_bytes"] * 8 / (topo.graph[node][peer]["rate_mbps"] * 1e6)
    return busy


class TimerWatch:
    """Started before the agents and stopped after them, like the samplers; where the
    kernel will not let the timers be watched, `summary` says why instead."""

    def __init__(self, tolerance: float):
        self.tolerance = tolerance
        self.timers: ShapingTimers | None = None
        self.reason: str | None = None
        self.before = self.after = None

    def start(self) -> TimerWatch:
        try:
            self.timers = ShapingTimers(self.tolerance).open()
        except TimersUnavailableError as exc:
            self.reason = str(exc)
            return self
        self.before = self.timers.counts()
        return self

    def stop(self) -> None:
        if self.timers is not None:
            self.after = self.timers.counts()
            self.timers.close()
            self.timers = None

    def summary(self, port_busy_s: float) -> dict:
        if self.before is None or self.after is None:
            return {"available": False, "reason": self.reason or "not measured"}
        got = summarize(self.before, self.after, self.tolerance)
        got["port_busy_s"] = round(port_busy_s, 3)
        got["lost_fraction"] = (round(got["lost_ms"] / 1e3 / port_busy_s, 6)
                                if port_busy_s else None)
        return {"available": True, "mechanism": MECHANISM, **got}
