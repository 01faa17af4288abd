"""The environment variables the testbed reads, each an input checked at start-up: a bad
value is one line naming the variable and what it allows (SpecError), before anything else.

    AFT_ENGINE        compiled or interpreted (traffic.engine)
    AFT_SSH_CONFIG    an ssh_config file for the servers: a regular file (fabric.cluster)
    AFT_SSH_NETNS     the network namespace ssh runs in: one in /run/netns (fabric.cluster)
    AFT_REMOTE_DIR    the servers' clone of the testbed: an absolute path (testbed.spread)
    AFT_CALIBRATION   the calibration file: a path that is no folder, FIFO or device
                      (testbed.rate)
    AFT_VM_DIR        the VM check's cache: an absolute path, a folder if it exists
                      (scripts/vm_check.py)

Unset is the default for each; so is empty, except for AFT_CALIBRATION (the default
file is the variable unset). AFT_FABRIC is no input: the testbed sets it in the
processes a fabric's nodes start, so that `clean` finds them.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from fabric.netns import RUN_DIR as NETNS_DIR
from topologies.spec import SpecError
from traffic.engine import ENGINE_ENV, ENGINES

NETNS_NAME_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}\Z")


class BadValueError(Exception):
    """What a variable's value is not (str(): what it allows)."""


def _plain(value: str) -> None:
    if not value.isprintable():
        raise BadValueError("must be printable, on one line")


def _engine(value: str) -> None:
    if value.strip().lower() not in ("", *ENGINES):
        raise BadValueError(f"must be one of {', '.join(ENGINES)}")


def _kind(path: Path) -> str | None:
    """'folder', 'file', another file type's name, or None if nothing is there."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadValueError(f"cannot be read ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISREG(mode):
        return "file"
    return "FIFO" if stat.S_ISFIFO(mode) else "device" if stat.S_ISCHR(mode) or \
        stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"


def _ssh_config(value: str) -> None:
    _plain(value)
    if value and _kind(Path(value)) != "file":
        raise BadValueError("must name an ssh_config file that exists")


def _ssh_netns(value: str) -> None:
    _plain(value)
    if value and (not NETNS_NAME_RE.match(value)
                  or not (Path(NETNS_DIR) / value).exists()):
        raise BadValueError(f"must name a network namespace in {NETNS_DIR} (ip netns list)")


def _absolute(value: str) -> None:
    _plain(value)
    if value and not value.startswith("/"):
        raise BadValueError("must be an absolute path")


def _calibration(value: str) -> None:
    _plain(value)
    if not value:
        raise BadValueError("must be a file's path (unset: the default file)")
    kind = _kind(Path(value))
    if kind not in (None, "file"):
        raise BadValueError(f"is a {kind}: must be a regular file's path (or one not made yet)")


def _vm_dir(value: str) -> None:
    _absolute(value)
    if value and _kind(Path(value)) not in (None, "folder"):
        raise BadValueError("must be a folder (or one not made yet)")


# name -> the check of its value (module docstring)
VARIABLES: dict[str, Callable[[str], None]] = {
    ENGINE_ENV: _engine,
    "AFT_SSH_CONFIG": _ssh_config,
    "AFT_SSH_NETNS": _ssh_netns,
    "AFT_REMOTE_DIR": _absolute,
    "AFT_CALIBRATION": _calibration,
    "AFT_VM_DIR": _vm_dir,
}


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """SpecError naming the first variable whose value is refused, and what it allows."""
    environ = os.environ if environ is None else environ
    for name, check in VARIABLES.items():
        value = environ.get(name)
        if value is None:
            continue
        try:
            check(value)
        except BadValueError as exc:
            raise SpecError(name, f"{value!r} {exc}") from None
