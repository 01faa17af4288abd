"""Named network namespaces of the testbed: names, ownership marks, entering, sysctls.

Every namespace the testbed makes is called `aft-<node>` (or `aft-<lab>.<node>` for a
fabric built under a lab name, so several can coexist) and is listed by
`ip netns list`. The name is for people; ownership is a mark: the namespace's `lo`
carries the alias OWNER_ALIAS (IFLA_IFALIAS), written before the namespace gets its
name, so `clean` never takes a user's `aft-something` for ours, even with no record.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns

from fabric.state import OWNER_ALIAS

PREFIX = "aft-"
RUN_DIR = Path("/run/netns")


def name_of(node: str, lab: str = "") -> str:
    return f"{PREFIX}{lab}.{node}" if lab else f"{PREFIX}{node}"


def in_lab(name: str, lab: str | None = None) -> bool:
    """Is `name` one of ours: of any lab (lab=None), or of one lab ("" = the default)?"""
    if not name.startswith(PREFIX):
        return False
    if lab is None:
        return True
    return name.startswith(f"{PREFIX}{lab}.") if lab else "." not in name


def named(lab: str | None = None) -> list[str]:
    """Named namespaces with our prefix, ours or not: all (lab=None), or one lab's names."""
    return sorted(n for n in pr_netns.listnetns() if in_lab(n, lab))


def ours(lab: str | None = None) -> list[str]:
    """Namespaces the testbed made (named like ours and carrying our mark): all
    (lab=None), or those of one lab."""
    return [n for n in named(lab) if is_marked(n)]


@contextlib.contextmanager
def entered(name: str):
    """Run the calling thread inside namespace `name` (never creates one), then return.

    Sockets opened inside stay in that namespace after the block ends.
    """
    if not (RUN_DIR / name).exists():
        raise FileNotFoundError(f"no network namespace {name}")
    with entered_path(str(RUN_DIR / name)):
        yield


@contextlib.contextmanager
def iproute(name: str):
    """An IPRoute whose netlink socket lives in namespace `name`, closed after the block."""
    with entered(name):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


@contextlib.contextmanager
def entered_path(path: str):
    """The calling thread inside the namespace at `path` (/run/netns/x, /proc/PID/ns/net:
    a process started inside a node may not see /run/netns's mounts, /proc it does)."""
    target = os.open(path, os.O_RDONLY)
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        pr_netns.setns(target, flags=0)
        yield
    finally:
        pr_netns.setns(saved, flags=0)
        os.close(saved)
        os.close(target)


# -- ownership marks -------------------------------------------------------------------
def _set_mark(ipr: IPRoute) -> None:
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], ifalias=OWNER_ALIAS)


def mark_process_ns(pid: int) -> None:
    """Mark the (still unnamed) namespace of process `pid` as the testbed's."""
    with entered_path(f"/proc/{pid}/ns/net"):
        ipr = IPRoute()
    with ipr:
        _set_mark(ipr)


def is_marked(name: str) -> bool:
    """Does namespace `name` carry the testbed's mark? (False if it is gone.)"""
    return (RUN_DIR / name).exists() and path_marked(str(RUN_DIR / name))


def path_marked(path: str) -> bool:
    """Does the namespace at `path` (/run/netns/x, /proc/PID/ns/net: named or not) carry
    the testbed's mark? (False if it is gone.)"""
    try:
        with entered_path(path):
            ipr = IPRoute()
    except OSError:
        return False
    with ipr:
        (lo,) = ipr.get_links(ifname="lo")
        return lo.get_attr("IFLA_IFALIAS") == OWNER_ALIAS


def create(name: str) -> None:
    """A new, empty, marked namespace `name` (scratch namespaces: doctor, benchmarks).

    The mark follows the creation by one netlink call; fabric nodes are marked before
    they are named (mark_process_ns, then attach).
    """
    pr_netns.create(name)
    try:
        with entered(name):
            ipr = IPRoute()
        with ipr:
            _set_mark(ipr)
    except BaseException:
        remove(name)
        raise


def write_sysctls(name: str, values: dict[str, int | str]) -> None:
    """Set net.* sysctls of namespace `name` ({'net.ipv4.ip_forward': 1, ...})."""
    with entered(name):
        for key, value in values.items():
            path = Path("/proc/sys") / key.replace(".", "/")
            path.write_text(f"{value}\n")


def read_sysctl(name: str, key: str) -> str:
    with entered(name):
        return (Path("/proc/sys") / key.replace(".", "/")).read_text().strip()


def attach(name: str, pid: int) -> None:
    """Give the namespace of process `pid` the name `name` (bind mount in /run/netns)."""
    pr_netns.attach(name, pid)


def remove(name: str) -> None:
    """Unname a namespace; the kernel frees it once no process is left inside."""
    with contextlib.suppress(FileNotFoundError):
        pr_netns.remove(name)


def inode(name: str) -> int | None:
    try:
        return os.stat(RUN_DIR / name).st_ino
    except FileNotFoundError:
        return None
