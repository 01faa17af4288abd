"""What a PFC run did, for its results folder: pfc.json (fabric.switch_report.report) and
pfc_timeline.csv, the controller's timeline; testbed.plots draws plots/pfc_*.png from
them with PANELS.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fabric.switch_report import TIMELINE_FIELDS, report

# the timeline's plots (testbed.plots): column, axis label, scale to it
PANELS = [("backlog_bytes", "lossless queue (KiB)", 1 / 1024),
          ("paused_s", "paused time (s, cumulative)", 1.0),
          ("frames_sent", "PFC frames sent", 1.0),
          ("drops", "lossless drops", 1.0)]


def write_results(ctl, folder: str | Path) -> dict:
    """pfc.json and pfc_timeline.csv in `folder` (testbed.plots draws them); the report."""
    rep = report(ctl)
    write_report(folder, rep, ctl.timeline)
    return rep


def write_report(folder: str | Path, rep: dict, timeline: list[dict]) -> None:
    """pfc.json (a controller's report) and pfc_timeline.csv (its timeline) in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pfc.json").write_text(json.dumps(rep, indent=1) + "\n")
    with open(folder / "pfc_timeline.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=TIMELINE_FIELDS)
        w.writeheader()
        w.writerows(timeline)
