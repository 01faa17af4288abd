"""Named network namespaces of the testbed: names, entering, sysctls, leftovers.

Every namespace the testbed makes is called `aft-<node>` (or `aft-<lab>.<node>` for a
fabric built under a lab name, so several can coexist) and is listed by
`ip netns list`; the prefix is how `clean` finds exactly ours.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pyroute2 import netns as pr_netns

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


def ours(lab: str | None = None) -> list[str]:
    """Named namespaces of the testbed: all (lab=None), or those of one lab."""
    return sorted(n for n in pr_netns.listnetns() if in_lab(n, lab))


@contextlib.contextmanager
def entered(name: str):
    """Run the calling thread inside namespace `name` (never creates one), then return.

    Sockets opened inside stay in that namespace after the block ends.
    """
    if not (RUN_DIR / name).exists():
        raise FileNotFoundError(f"no network namespace {name}")
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        pr_netns.setns(name, flags=0)
        yield
    finally:
        pr_netns.setns(saved, flags=0)
        os.close(saved)


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
