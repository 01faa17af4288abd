"""Failure playback in a process of its own: kernel changes at their scheduled times.

fabric/impair.py turns a failure schedule into steps of kernel operations (port rate,
port up/down, routes back) and hands them to this module, run as a child process:

    parent (Impairments)                         child (python -m fabric.failplay)
    plan: [{t_s, ops}, ...]  ──stdin line──▶     nice -10, one netlink socket per node
                             ◀──"ready"───
    go <t0_ns>               ──stdin line──▶     sleep until t0 + t_s; do the ops
                             ◀──{"i", "began_ns", "done_ns", "error"} per step
    close stdin (job ended)  ──EOF─────────▶     stop before the next step; exit

Why a process: a thread in the orchestrating process shares the GIL with the link
sampler and the PFC controller; on a 2-core machine busy with agents the thread holding
the GIL is descheduled, and a failure due at 0.3 s landed at 0.67 s. A process has its
own interpreter, runs above the agents (nice -10, as root) and does nothing else.
Times are CLOCK_MONOTONIC, which every process and namespace shares.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl.ndmsg import NUD_PERMANENT

from fabric import netns
from fabric.shaping import set_rate

NICE = -10          # above the agents (0): the scheduler wakes this first (as root)


def add_neighbour(ipr, index: int, address: str, mac: str) -> None:
    """The link's peer as a permanent neighbour of port `index`: routers never ARP, so
    a lost ARP frame (loss is emulated on every frame of a link) cannot stall a next
    hop for the kernel's 1 s ARP retry, and no packet waits in the neighbour queue.
    The kernel flushes permanent entries when a port goes admin down, so a port that
    comes back up gets its entry again (run_ops)."""
    ipr.neigh("replace", ifindex=index, dst=address, lladdr=mac, state=NUD_PERMANENT)


def run_ops(ops: list[dict], ipr_for) -> None:
    """Do `ops` in order; ipr_for(op) gives an IPRoute in op["ns"] (a context manager)."""
    for op in ops:
        with ipr_for(op) as ipr:
            if op["op"] == "routes":
                for route in op["routes"]:
                    hops = [{"gateway": h["gateway"],
                             "oif": ipr.link_lookup(ifname=h["ifname"])[0]}
                            for h in route["hops"]]
                    kwargs = {"prefsrc": route["prefsrc"]}
                    if len(hops) == 1:
                        kwargs.update(hops[0])
                    else:
                        kwargs["multipath"] = hops
                    ipr.route("replace", dst=route["dst"], **kwargs)
                continue
            index = ipr.link_lookup(ifname=op["ifname"])[0]
            if op["op"] == "state":
                ipr.link("set", index=index, state=op["state"])
                if "neighbour" in op:
                    add_neighbour(ipr, index, *op["neighbour"])
            elif op["op"] == "rate":
                set_rate(ipr, index, op["rate_mbps"])
            else:
                raise ValueError(f"unknown op {op['op']!r}")


def _stdin_closed(timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the parent to close stdin (stop); True if it did."""
    readable, _, _ = select.select([sys.stdin.buffer], [], [], max(0.0, timeout_s))
    return bool(readable) and sys.stdin.buffer.readline() == b""


def _wait_until(deadline_ns: int) -> bool:
    """Sleep until `deadline_ns` (monotonic); False if the parent said stop first."""
    while True:
        left_s = (deadline_ns - time.monotonic_ns()) / 1e9
        if left_s <= 0:
            return True
        if _stdin_closed(left_s):
            return False


def _say(data: dict | str) -> None:
    sys.stdout.write((data if isinstance(data, str) else json.dumps(data)) + "\n")
    sys.stdout.flush()


def main() -> int:
    with contextlib.suppress(OSError):      # if `nice` was not there to start it so
        if os.getpriority(os.PRIO_PROCESS, 0) > NICE:
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
    plan = json.loads(sys.stdin.buffer.readline())
    iprs: dict[str, IPRoute] = {}
    for ns in sorted({op["ns"] for step in plan["steps"] for op in step["ops"]}):
        with netns.entered(ns):
            iprs[ns] = IPRoute()

    @contextlib.contextmanager
    def ipr_for(op):
        yield iprs[op["ns"]]

    try:
        _say("ready")
        go = sys.stdin.buffer.readline().split()
        if len(go) != 2 or go[0] != b"go":
            return 0                        # the parent gave up before the start
        t0_ns = int(go[1])
        for i, step in enumerate(plan["steps"]):
            if not _wait_until(t0_ns + round(step["t_s"] * 1e9)):
                return 0
            began_ns = time.monotonic_ns()
            error = None
            try:
                run_ops(step["ops"], ipr_for)
            except Exception as exc:  # reported; the remaining steps still run
                error = repr(exc)
            _say({"i": i, "began_ns": began_ns, "done_ns": time.monotonic_ns(),
                  "error": error})
        return 0
    finally:
        for ipr in iprs.values():
            ipr.close()


if __name__ == "__main__":
    sys.exit(main())
