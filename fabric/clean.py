"""Clean: remove every namespace, interface and process the testbed made, and only those.

What is ours: named namespaces `aft-*`; processes inside them or carrying the fabric
marker in their environment (Mininet shells and what they started); root-namespace
links named `aftb*` (only the plain-Mininet baseline of the benchmark makes those).
Works without the state file, so it also cleans after a crash or `kill -9`. Idempotent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute

from fabric import netns
from fabric.state import MARKER_ENV, STATE_DIR, read_state, state_file

BASELINE_LINK_PREFIX = "aftb"


@dataclass
class CleanReport:
    processes: list[int] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def total(self) -> int:
        return len(self.processes) + len(self.namespaces) + len(self.links)


def _marker(pid: int) -> str | None:
    """The fabric marker in a process's environment (the namespace it was started for)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = MARKER_ENV.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def our_processes(names: list[str] | None = None) -> list[int]:
    """PIDs inside the given (default: all of ours) namespaces or marked as started there."""
    inodes = {netns.inode(n) for n in (netns.ours() if names is None else names)} - {None}
    wanted = None if names is None else set(names)
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _netns_inode(pid) in inodes:
            pids.append(pid)
            continue
        marker = _marker(pid)
        if marker is not None and (wanted is None or marker in wanted):
            pids.append(pid)
    return pids


def kill_inside(names: list[str] | None = None, grace_s: float = 1.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace_s`, every process of ours; returns their PIDs."""
    pids = our_processes(names)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                alive.append(pid)
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.02)
        if not alive:
            break
    return pids


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def baseline_links() -> list[str]:
    with IPRoute() as ipr:
        return [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()
                if link.get_attr("IFLA_IFNAME").startswith(BASELINE_LINK_PREFIX)]


def remove_baseline_links() -> list[str]:
    """Delete the benchmark baseline's root-namespace links (`aftb*`); return their names."""
    removed = []
    with IPRoute() as ipr:
        for name in baseline_links():
            with contextlib.suppress(Exception):
                ipr.link("del", index=ipr.link_lookup(ifname=name)[0])
                removed.append(name)
    return removed


def clean() -> CleanReport:
    report = CleanReport()
    report.processes = kill_inside(None)
    for name in netns.ours():
        netns.remove(name)
        report.namespaces.append(name)
    report.links = remove_baseline_links()
    for path in STATE_DIR.glob("*.json"):
        path.unlink(missing_ok=True)
    return report


def leftovers(lab: str | None = None) -> int:
    """How many things of ours exist now: all (lab=None) or one lab's; 0 after teardown."""
    names = netns.ours(lab)
    if lab is None:
        return len(our_processes(None)) + len(names) + len(baseline_links())
    inside = set(our_processes(names))
    marked = {p for p in our_processes(None) if netns.in_lab(_marker(p) or "", lab)}
    return len(inside | marked) + len(names)


def destroy(lab: str = "") -> CleanReport:
    """Remove a deployed fabric: its namespaces (from its state file, else every one of
    its lab) and every process inside them."""
    state = read_state(lab)
    names = [n for n in (state or {}).get("namespaces", []) if netns.inode(n)] or netns.ours(lab)
    report = CleanReport()
    report.processes = kill_inside(names)
    for name in names:
        netns.remove(name)
        report.namespaces.append(name)
    state_file(lab).unlink(missing_ok=True)
    return report
