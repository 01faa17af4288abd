"""Clean: remove every namespace, interface and process the testbed made, and only those.

What is ours is what a record names or a mark claims (fabric/state.py), never a name alone:
  - namespaces: named `aft-*` and either listed in a record (/run/testbed/*.json) or
    carrying the testbed's mark (the alias of their `lo`);
  - processes: inside those namespaces, or carrying the fabric marker in their
    environment (Mininet shells and what they started);
  - root-namespace links: listed in a record (the benchmark's plain-Mininet baseline
    records them before it creates them) or carrying the mark as their alias.
A user's namespace `aft-mine` or bridge `aftbmine0` is left alone. The marks live on the
kernel objects, so clean also works after a crash or `kill -9` lost the records; a run
that was killed gets FAILED in its results folder. Idempotent.
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
from fabric.state import (
    MARKER_ENV,
    OWNER_ALIAS,
    STATE_DIR,
    all_records,
    mark_failed,
    read_state,
    run_alive,
    state_file,
)

KILLED_REASON = "killed: cleaned up by testbed clean"


@dataclass
class CleanReport:
    processes: list[int] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)   # results folders marked FAILED

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


def recorded_namespaces(lab: str | None = None, records: dict | None = None) -> set[str]:
    """Namespaces the records name (and that exist): all (lab=None) or one lab's."""
    records = all_records() if records is None else records
    names = {n for data in records.values() for n in data.get("namespaces", [])}
    return {n for n in names if netns.in_lab(n, lab) and netns.inode(n) is not None}


def owned_namespaces(lab: str | None = None, records: dict | None = None) -> list[str]:
    """Namespaces of the testbed: recorded or marked; all (lab=None) or one lab's."""
    return sorted(recorded_namespaces(lab, records) | set(netns.ours(lab)))


def our_processes(names: list[str] | None = None) -> list[int]:
    """PIDs inside the given (default: all of ours) namespaces or marked as started there."""
    inodes = {netns.inode(n) for n in (owned_namespaces() if names is None else names)}
    inodes.discard(None)
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


def root_links(records: dict | None = None) -> list[str]:
    """Root-namespace links of the testbed: recorded by name or carrying our alias."""
    records = all_records() if records is None else records
    recorded = {n for data in records.values() for n in data.get("root_links", [])}
    with IPRoute() as ipr:
        return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links()
                      if link.get_attr("IFLA_IFALIAS") == OWNER_ALIAS
                      or link.get_attr("IFLA_IFNAME") in recorded)


def remove_root_links(records: dict | None = None) -> list[str]:
    """Delete the testbed's root-namespace links; return the names of those deleted.

    A veth goes with its peer, so a name may be gone by the time its turn comes.
    """
    removed = []
    with IPRoute() as ipr:
        for name in root_links(records):
            indices = ipr.link_lookup(ifname=name)
            if indices:
                with contextlib.suppress(Exception):
                    ipr.link("del", index=indices[0])
                    removed.append(name)
    return removed


def mark_killed_runs(records: dict) -> list[str]:
    """FAILED in the results folder of every recorded run whose process is gone (with,
    for a run on several machines, the command that cleans them)."""
    marked = []
    for data in records.values():
        run = data.get("run")
        if not run or run_alive(run):
            continue
        folder = Path(run.get("results", ""))
        if run.get("results") and folder.is_dir():
            # a run on several machines: its parts there are theirs to clean
            hint = (f"; its servers may still hold its parts: testbed clean --servers "
                    f"{','.join(run['servers'])}" if run.get("servers") else "")
            mark_failed(folder, KILLED_REASON + hint)
            marked.append(str(folder) + hint)
    return marked


def clean() -> CleanReport:
    records = all_records()
    names = owned_namespaces(None, records)
    report = CleanReport()
    report.processes = kill_inside(None)   # in those namespaces, or marked
    for name in names:
        netns.remove(name)
        report.namespaces.append(name)
    report.links = remove_root_links(records)
    report.failed_runs = mark_killed_runs(records)
    for path in STATE_DIR.glob("*.json"):
        path.unlink(missing_ok=True)
    return report


def leftovers(lab: str | None = None) -> int:
    """How many things of ours exist now: all (lab=None) or one lab's; 0 after teardown."""
    names = owned_namespaces(lab)
    if lab is None:
        return len(our_processes(None)) + len(names) + len(root_links())
    inside = set(our_processes(names))
    marked = {p for p in our_processes(None) if netns.in_lab(_marker(p) or "", lab)}
    return len(inside | marked) + len(names)


def destroy(lab: str = "") -> CleanReport:
    """Remove a deployed fabric: its namespaces (from its state file, else every one of
    its lab) and every process inside them."""
    state = read_state(lab) or {}
    names = sorted(n for n in state.get("namespaces", [])
                   if netns.in_lab(n, lab) and netns.inode(n)) or netns.ours(lab)
    report = CleanReport()
    report.processes = kill_inside(names)
    for name in names:
        netns.remove(name)
        report.namespaces.append(name)
    state_file(lab).unlink(missing_ok=True)
    return report
