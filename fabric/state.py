"""What a built fabric leaves on disk so other commands can find it: one JSON record per lab.

`testbed deploy` writes the record and `destroy`, `inspect` and `clean` read it; every
process a fabric's nodes start carries MARKER_ENV, so `clean` finds them without it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

MARKER_ENV = "AFT_FABRIC"   # set in every process the fabric's nodes start
STATE_DIR = Path("/run/testbed")
STATE_FILE = STATE_DIR / "fabric.json"


def state_file(lab: str = "") -> Path:
    return STATE_DIR / f"{lab}.json" if lab else STATE_FILE


def write_state(fabric) -> None:
    """Record a started fabric (a fabric.core.Fabric): topology, seed, lab, namespaces."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    data = {"topology": fabric.topo.to_data(), "seed": fabric.seed, "lab": fabric.lab,
            "seed_supported": fabric.seed_supported,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "pid": os.getpid(),
            "namespaces": fabric.namespaces()}
    path = state_file(fabric.lab)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def read_state(lab: str = "") -> dict | None:
    try:
        return json.loads(state_file(lab).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
