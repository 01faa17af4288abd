"""The kernel's own receive work over a run, from /proc/net/softnet_stat.

Every frame a veth hands over goes onto a CPU's input backlog (netif_rx) and is
forwarded from there by the NET_RX softirq, at every hop of the fabric. The kernel
counts, per CPU and for the whole machine (every namespace shares the CPUs):

    column 1  processed       frames the softirq took off the backlogs
    column 2  dropped         frames refused because a backlog was full
                              (net.core.netdev_max_backlog): lost in the host, not in a
                              switch's queue, and counted by no qdisc
    column 3  time_squeeze    times the softirq stopped with frames still waiting (its
                              budget of frames or its 2 jiffies ran out); the rest waits
                              for the next softirq or for ksoftirqd, a thread of normal
                              priority that then competes with the agents for the CPU

The agents' own figures (testbed.fidelity) see an agent that fell behind, not a kernel
that forwards late; these two counters do. The machine is shared: whatever else ran
meanwhile is counted too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SOFTNET_STAT = Path("/proc/net/softnet_stat")


@dataclass(frozen=True)
class Softnet:
    """The machine's totals, summed over its CPUs."""

    processed: int
    dropped: int
    squeezed: int


def parse(text: str) -> Softnet:
    """Sum the per-CPU rows (hexadecimal columns) of softnet_stat's `text`."""
    processed = dropped = squeezed = 0
    for row in text.splitlines():
        cols = row.split()
        if len(cols) < 3:
            continue
        processed += int(cols[0], 16)
        dropped += int(cols[1], 16)
        squeezed += int(cols[2], 16)
    return Softnet(processed, dropped, squeezed)


def read(path: Path = SOFTNET_STAT) -> Softnet | None:
    """The counters now; None where the kernel does not show them."""
    try:
        return parse(path.read_text())
    except (OSError, ValueError):
        return None


def delta(before: Softnet | None, after: Softnet | None) -> dict | None:
    """What the kernel counted between two reads (counters are 32 bits per CPU: a
    negative difference means one wrapped, and the figures are then unknown)."""
    if before is None or after is None:
        return None
    got = {"processed": after.processed - before.processed,
           "backlog_drops": after.dropped - before.dropped,
           "squeezes": after.squeezed - before.squeezed}
    if min(got.values()) < 0:
        return None
    got["squeezes_per_1k_frames"] = (round(1e3 * got["squeezes"] / got["processed"], 3)
                                     if got["processed"] else 0.0)
    return got
