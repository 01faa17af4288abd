"""What the testbed leaves on disk and on kernel objects so other commands can find it.

One JSON record per lab, /run/testbed/<lab>.json, holding what is live under that lab:
  - the fabric (written by `Fabric.start`, dropped by `Fabric.stop`): topology, seed,
    namespaces, the pid that built it;
  - a run (`testbed run`, the scripts): its pid, the pid's start time and its results
    folder, so `clean` can mark the folder FAILED after a `kill -9`;
  - root-namespace links (the benchmark's plain-Mininet baseline): their names.
`deploy` writes the record and `destroy`, `inspect` and `clean` read it.

Records can be missing after a crash, so ownership is also marked on what we create:
every process a fabric's nodes start carries MARKER_ENV in its environment, and every
namespace (on its `lo`) and root-namespace link we make carries OWNER_ALIAS as its
interface alias (IFLA_IFALIAS). `clean` removes only what a record names or a mark
claims, never something that merely looks like ours by name.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

MARKER_ENV = "AFT_FABRIC"     # set in every process the fabric's nodes start
OWNER_ALIAS = "aft-testbed"   # IFLA_IFALIAS of every namespace's lo and root link we make
STATE_DIR = Path("/run/testbed")
STATE_FILE = STATE_DIR / "fabric.json"
FAILED_FILE = "FAILED"
FABRIC_KEYS = ("topology", "seed", "lab", "seed_supported", "created_utc", "pid",
               "namespaces")


def state_file(lab: str = "") -> Path:
    return STATE_DIR / f"{lab}.json" if lab else STATE_FILE


def read_state(lab: str = "") -> dict | None:
    try:
        return json.loads(state_file(lab).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def all_records() -> dict[str, dict]:
    """Every record on disk: {lab: record} ("" for the default lab)."""
    records = {}
    for path in sorted(STATE_DIR.glob("*.json")):
        lab = "" if path == STATE_FILE else path.stem
        data = read_state(lab)
        if data is not None:
            records[lab] = data
    return records


def update_record(lab: str, entries: dict) -> None:
    """Add or replace `entries` in the lab's record, keeping the rest (atomic rewrite)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    _write(lab, {**(read_state(lab) or {}), **entries})


def drop_from_record(lab: str, keys) -> None:
    """Remove `keys` from the lab's record; the file goes when nothing is left in it."""
    data = read_state(lab)
    if data is None:
        return
    rest = {k: v for k, v in data.items() if k not in keys}
    if rest:
        _write(lab, rest)
    else:
        state_file(lab).unlink(missing_ok=True)


def _write(lab: str, data: dict) -> None:
    path = state_file(lab)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


# -- the fabric ------------------------------------------------------------------------
def write_state(fabric) -> None:
    """Record a started fabric (a fabric.core.Fabric): topology, seed, lab, namespaces."""
    update_record(fabric.lab, {
        "topology": fabric.topo.to_data(), "seed": fabric.seed, "lab": fabric.lab,
        "seed_supported": fabric.seed_supported,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pid": os.getpid(), "namespaces": fabric.namespaces()})


def forget_fabric(lab: str = "") -> None:
    """The fabric of `lab` is gone; a run's entry in the same record stays."""
    drop_from_record(lab, FABRIC_KEYS)


# -- a run and its results folder ------------------------------------------------------
def process_start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): tells a pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def record_run(lab: str, results: Path, servers: list[str] | None = None) -> None:
    """This process runs an experiment under `lab` writing into the folder `results`
    (on the machines `servers`, when the fabric is spread over several)."""
    update_record(lab, {"run": {"pid": os.getpid(),
                                "pid_start_ticks": process_start_ticks(os.getpid()),
                                "results": str(Path(results).resolve()),
                                **({"servers": list(servers)} if servers else {})}})


def forget_run(lab: str) -> None:
    drop_from_record(lab, ("run",))


def run_alive(run: dict) -> bool:
    """Is the process that recorded `run` still running (the same process, not a reuse)?"""
    ticks = process_start_ticks(run.get("pid", -1))
    return ticks is not None and ticks == run.get("pid_start_ticks")


def mark_failed(folder: Path, reason: str) -> None:
    """Leave FAILED with the reason in a results folder; a later reason is appended."""
    path = Path(folder) / FAILED_FILE
    with path.open("a") as out:
        out.write(reason.rstrip() + "\n")


# -- root-namespace links ----------------------------------------------------------------
def record_root_links(lab: str, names: list[str]) -> None:
    """Root-namespace links this process is about to create (recorded before they exist)."""
    update_record(lab, {"root_links": sorted(names)})


def forget_root_links(lab: str) -> None:
    drop_from_record(lab, ("root_links",))
