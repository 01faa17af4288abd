"""Clean: remove every namespace, interface and process the testbed made, and only those.

What is ours is what a record names or a mark claims (fabric/state.py), never a name alone:
  - namespaces: named `aft-*` and either listed in a record (/run/testbed/*.json) or
    carrying the testbed's mark (the alias of their `lo`);
  - processes: inside those namespaces; or carrying the fabric marker in their
    environment (MARKER_ENV, set for every process a node starts) when the marker names
    one of those namespaces or a recorded one, or when it is in our format (`aft-...`)
    and the process proves where it came from: its (unnamed) namespace carries our
    mark, it is a Mininet shell (`mininet:<node>` in its command line: the plain-Mininet
    baseline's, whose namespaces are not ours to mark), or a shell of that kind with the
    same marker started it or shares its namespace. A marker alone (`AFT_FABRIC=mine`
    in someone's shell) proves nothing;
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


def recorded_names(records: dict) -> set[str]:
    """Every namespace the records name, whether it still exists or not."""
    return {n for data in records.values() for n in data.get("namespaces", [])}


def our_processes(names: list[str] | None = None) -> list[int]:
    """PIDs inside the given (default: all of ours) namespaces, or marked as started
    there; with no names, also the marked processes that prove they are ours (module
    doc) though their namespace is gone or was never named."""
    records = all_records() if names is None else {}
    owned = owned_namespaces(None, records) if names is None else list(names)
    inodes = {netns.inode(n) for n in owned}
    inodes.discard(None)
    wanted = set(owned) | recorded_names(records)
    me = os.getpid()
    pids, candidates = [], {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _netns_inode(pid) in inodes:
            pids.append(pid)
            continue
        marker = _marker(pid)
        if marker is None:
            continue
        if marker in wanted:
            pids.append(pid)
        elif names is None and netns.in_lab(marker):
            candidates[pid] = marker
    return pids + _proven(candidates)


def _proven(candidates: dict[int, str]) -> list[int]:
    """Of marked processes {pid: marker} that no record or named namespace claims, those
    whose namespace carries our mark, the Mininet shells, and what such a shell started
    (its descendants) or runs beside it (its namespace, when not ours) with its marker."""
    here = _netns_inode(os.getpid())
    proven = {pid for pid in candidates if _mininet_shell(pid)}
    shell_ns = {(_netns_inode(p), candidates[p]) for p in proven}   # not the root's:
    shell_ns = {(ns, m) for ns, m in shell_ns if ns != here}       # a bridge's shell is there
    for pid, marker in candidates.items():
        if pid in proven:
            continue
        ns = _netns_inode(pid)
        if (ns, marker) in shell_ns or _descends(pid, proven, candidates, marker) or (
                ns is not None and ns != here and netns.path_marked(f"/proc/{pid}/ns/net")):
            proven.add(pid)
    return sorted(proven)


def _mininet_shell(pid: int) -> bool:
    """Is `pid` a Mininet node's shell (`bash ... mininet:<node>`)?"""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.startswith(b"mininet:") for arg in argv)


def _descends(pid: int, shells: set[int], candidates: dict[int, str], marker: str) -> bool:
    """Was `pid` started (through any chain) by one of `shells` carrying `marker`?"""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        pid = _parent(pid)
        if pid in shells and candidates.get(pid) == marker:
            return True
    return False


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


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
