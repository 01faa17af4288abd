#!/usr/bin/env python3
"""Benchmark: the results pages' size and the time to write them.

Two real runs in a temporary folder, then the pages written again from their files:
- the demo's claim 2 (scripts/pfc_hol.py at its defaults: PFC off and on beside a
  victim flow, 2 x 4 hosts), each run's summary.html and the script's index.html:
  html_report_bytes is the largest of them (goal: under 2 MB, everything inline);
- a ring all-reduce over the first 8 GPUs of rail128 (every one of its 288 links built
  and sampled, 576 ports): html_report_s is the time testbed.page takes to write its
  summary.html (median of `--repeats`, goal: under 2 s), beside report_total_s, the
  whole `testbed report` of the same folder (the plots redrawn, summary.md, the page),
  measured in the same loop, and html_report_bytes_rail128.

Merges those figures, html_report_s_max and the machine's calibration into
results/bench.json.

    sudo .venv/bin/python scripts/bench_html.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.benchmarks import machine_line, update_bench_json
from testbed.experiment import from_toml
from testbed.page import PAGE, write_run_page
from testbed.page_index import INDEX, run_folders
from testbed.report_folder import report
from testbed.run import run

ROOT = Path(__file__).resolve().parent.parent
GOAL_BYTES = 2_000_000
GOAL_S = 2.0


def claim2_pages(tmp: Path) -> dict[str, int]:
    """Run claim 2 as the demo does; each page's size in bytes, by its path."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pfc_hol.py"),
                          "--results", str(tmp)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"bench_html: pfc_hol.py failed: {out.stderr.strip()[-400:]}")
    script = next(p for p in tmp.iterdir() if p.is_dir() and p.name.startswith("pfc_hol-"))
    pages = [script / INDEX] + [r / PAGE for r in run_folders(script)]
    return {str(p.relative_to(tmp)): p.stat().st_size for p in pages}


def rail128_folder(tmp: Path) -> Path:
    folder, _ = run(from_toml(None, {
        "name": "bench_html_rail128", "workload": "allreduce", "ranks": 8,
        "message_bytes": 256 * 1024, "iterations": 1, "results_dir": str(tmp),
        "timeout_s": 600.0, "topology": "rail128"}))
    return folder


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="times each write is measured")
    ap.add_argument("--bench", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args()
    if args.repeats < 1:
        print("error: --repeats: must be at least 1", file=sys.stderr)
        return 2
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="aft-bench-html-") as tmp:
        sizes = claim2_pages(Path(tmp))
        for name, size in sizes.items():
            print(f"  {name}: {size / 1e6:.3f} MB")
        folder = rail128_folder(Path(tmp))
        page_s, report_s = [], []
        for _ in range(args.repeats):
            page_s.append(timed(lambda: write_run_page(folder)))
            report_s.append(timed(lambda: report(folder)))
        rail_bytes = (folder / PAGE).stat().st_size
    biggest = max(sizes.values())
    figures = {"html_report_bytes": biggest, "html_report_bytes_rail128": rail_bytes,
               "html_report_s": round(statistics.median(page_s), 4),
               "html_report_s_max": round(max(page_s), 4),
               "report_total_s": round(statistics.median(report_s), 4)}
    print(f"html_report_bytes {biggest} (claim 2's largest page; goal < {GOAL_BYTES}: "
          f"{'met' if biggest < GOAL_BYTES else 'NOT met'})")
    print(f"html_report_s {figures['html_report_s']} s median, {figures['html_report_s_max']}"
          f" s max, on rail128's 288 links (goal < {GOAL_S} s: "
          f"{'met' if max(page_s) < GOAL_S else 'NOT met'}); the whole report of the same "
          f"folder {figures['report_total_s']} s: the page is "
          f"{statistics.median(page_s) / statistics.median(report_s):.0%} of it; "
          f"rail128's page {rail_bytes / 1e6:.3f} MB")
    update_bench_json(args.bench, figures)
    print(f"merged into {args.bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
