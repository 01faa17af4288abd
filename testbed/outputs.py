"""Where results and drawings go: a folder the testbed may create, checked before it is.

A results base (`--results`, `experiment.results_dir`) is refused in one line naming the
field, before anything is built, when it cannot hold files: a file stands on its way, its
nearest existing folder is not writable, or that folder is on a kernel pseudo-filesystem
(/proc, /sys, ...), where mkdir fails or writes something that is not a file. A single
output file (`graph -o`) must go into a folder that exists: it is never created.
"""

from __future__ import annotations

import os
from pathlib import Path

from topologies.spec import SpecError

# Filesystems that hold kernel objects, not files (the type column of /proc/self/mounts)
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "devpts",
    "bpf", "configfs", "pstore", "mqueue", "fusectl", "efivarfs", "binfmt_misc",
    "autofs", "nsfs", "rpc_pipefs",
})
MOUNTS = Path("/proc/self/mounts")


def nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (as a link target: resolved)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def filesystem_of(path: Path, mounts: Path = MOUNTS) -> str | None:
    """The filesystem type of the mount holding `path` (the longest mount point that is
    a prefix of it); None when the mount table cannot be read."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def check_output_folder(field: str, folder: str | Path) -> None:
    """Refuse (SpecError naming `field`) a folder the testbed could not create or write."""
    folder = Path(folder)
    base = nearest_existing(folder)
    if not base.is_dir():
        raise SpecError(field, f"{folder} cannot be a folder: {base} is a file")
    kind = filesystem_of(base)
    if kind in PSEUDO_FILESYSTEMS:
        raise SpecError(field, f"{folder} is on {base}, a {kind} filesystem of the kernel's, "
                        "not a place for files")
    if not os.access(base, os.W_OK | os.X_OK):
        raise SpecError(field, f"{folder} cannot be created: {base} is not writable")


def check_output_file(field: str, path: str | Path) -> Path:
    """Refuse (SpecError naming `field`) a file path whose folder does not exist (it is
    not created for a single file) or cannot be written, or that names a folder."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(field, f"{path} is a folder; name the file to write")
    folder = path.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise SpecError(field, f"{folder} {what}: the folder must exist (it is not created)")
    check_output_folder(field, folder)
    return path


def make_folder(field: str, folder: str | Path) -> Path:
    """Create `folder` (and its parents) after check_output_folder; an error the checks
    could not foresee (a full disk, a read-only mount) is a SpecError naming `field` too."""
    check_output_folder(field, folder)
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(field, f"{folder} cannot be created: {exc.strerror}") from None
    return folder


def replace_file(path: Path, write) -> Path:
    """Write a new file at `path` by `write(temporary path)`, then rename it over `path`:
    a link standing at `path` (symbolic or hard) is replaced, never written through."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def save_figure(fig, path: Path) -> Path:
    """Lay out `fig` and write it to `path` (PNG) by replace_file; the path."""
    fig.tight_layout()
    return replace_file(path, lambda tmp: fig.savefig(tmp, format="png"))


def save_plot(fig, folder: Path, name: str) -> Path:
    """Lay out `fig` and write it to folder/plots/name; the path."""
    path = folder / "plots" / name
    path.parent.mkdir(exist_ok=True)
    return save_figure(fig, path)
