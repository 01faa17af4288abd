#!/usr/bin/env python3
"""Benchmark: the lossless class holds (no lossless drop) and an incast ends near its bound.

Every item is a `testbed run` (a child process, under `flock $AFT_BENCH_LOCK` when that
variable names a lock file, so a shared machine's lock is held per run, not for the
whole benchmark), each read back from its results folder:

  incast15      15:1 incast of 2 MiB on a 4 x 4 leaf-spine with 4 hosts per leaf, PFC on,
                --rate auto, --runs times: lossless drops (goal 0) and JCT over the fluid
                bound n S / B (goal <= 1.10; htsim 1.03 for this incast,
                testbed.incast_expect), its XOFF frames per second beside the fluid
                model's range (the run's own expected vs measured rows)
  incast31      31:1 incast on the same leaf-spine with 8 hosts per leaf, the widest
                fan-in of the default fabrics: lossless drops (goal 0)
  lossy15       the 15:1 incast with PFC off at a forced 500 Mbit/s: every flow's time
                split (flows.csv) adds up to its FCT, the parts on its timeline
                (testbed.attribution.PARTS and unexplained_s, not overlap_s, which is
                time two causes both explain) over fct_s (goal 0.95-1.05 for every flow);
                the smallest share its causes explain beside it
  incast3/7     3:1 and 7:1 incasts on the leaf-spine and on rail_optimized, PFC on,
                --rate auto: lossless drops (goal 0)
  alltoall, permutation   on the leaf-spine, PFC on, --rate auto: lossless drops (goal 0)

Merges into results/bench.json: pfc_incast15_lossless_drops (the most over the runs),
pfc_incast15_jct_over_bound (the largest, and _min), pfc_incast31_lossless_drops,
attribution_sum_over_fct (the farthest from 1 of any flow, with _min and _max),
attribution_explained_min, pfc_<item>_lossless_drops for the others, and each item's
fidelity verdicts. --quick: one run each of smaller messages, no 31:1 (a smoke test).

    sudo AFT_BENCH_LOCK=/tmp/aft-root.lock .venv/bin/python scripts/bench_lossless.py \
        [--runs 3] [--quick] [--only incast15 lossy15 ...] [--keep] [--out F]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from testbed.attribution import PARTS
from testbed.benchmarks import machine_line, update_bench_json
from testbed.run_result import RunResult

ROOT = Path(__file__).resolve().parent.parent
LOCK_ENV = "AFT_BENCH_LOCK"
MESSAGE = 2 * 1024 * 1024
QUICK_MESSAGE = 256 * 1024
LEAF_SPINE = ["--topology", "leaf_spine", "--set", "leaves=4", "--set", "spines=4"]
JCT_GOAL = 1.10
SUM_GOAL = (0.95, 1.05)


@dataclass
class Item:
    name: str
    what: str
    argv: list[str]
    runs: int = 1
    results: list[dict] = field(default_factory=list)


def items(args) -> list[Item]:
    size = str(QUICK_MESSAGE if args.quick else args.message_bytes)
    ls4 = [*LEAF_SPINE, "--set", "hosts_per_leaf=4"]
    common = ["--message-bytes", size, "--iterations", "1"]
    pfc = ["--pfc", "on", "--rate", "auto"]
    out = [Item("incast15", "15:1 incast, leaf-spine 4x4x4",
                [*ls4, "--workload", "incast", *common, *pfc], 1 if args.quick else args.runs),
           Item("lossy15", "15:1 incast, PFC off, 500 Mbit/s forced",
                [*ls4, "--workload", "incast", *common, "--pfc", "off", "--rate", "500",
                 "--force"]),
           Item("incast3_leaf_spine", "3:1 incast, leaf-spine 4x4x4",
                [*ls4, "--workload", "incast", "--ranks", "4", *common, *pfc]),
           Item("incast7_leaf_spine", "7:1 incast, leaf-spine 4x4x4",
                [*ls4, "--workload", "incast", "--ranks", "8", *common, *pfc]),
           Item("incast3_rail", "3:1 incast, rail_optimized",
                ["--topology", "rail_optimized", "--workload", "incast", "--ranks", "4",
                 *common, *pfc]),
           Item("incast7_rail", "7:1 incast, rail_optimized",
                ["--topology", "rail_optimized", "--workload", "incast", "--ranks", "8",
                 *common, *pfc]),
           Item("alltoall", "all-to-all, leaf-spine 4x4x4",
                [*ls4, "--workload", "alltoall", *common, *pfc]),
           Item("permutation", "permutation, leaf-spine 4x4x4",
                [*ls4, "--workload", "permutation", *common, *pfc])]
    if not args.quick:
        out.insert(1, Item("incast31", "31:1 incast, leaf-spine 4x4x8",
                           [*LEAF_SPINE, "--set", "hosts_per_leaf=8", "--workload", "incast",
                            *common, *pfc]))
    return [i for i in out if not args.only or i.name in args.only]


def run_once(item: Item, base: Path, k: int) -> dict:
    """One `testbed run` of the item into its own folder; what the bench reads of it."""
    where = Path(tempfile.mkdtemp(prefix=f"{item.name}-{k}-", dir=base))   # kept runs stay
    argv = [sys.executable, "-m", "testbed", "run", *item.argv, "--name", item.name,
            "--results-dir", str(where)]
    lock = os.environ.get(LOCK_ENV)
    if lock:
        argv = ["flock", lock, *argv]
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    folders = sorted(where.iterdir())
    if not folders or not (folders[0] / "metrics.json").exists():
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "error": f"exit {done.returncode}: {tail[0]}"}
    return read_run(folders[0], done.returncode)


def read_run(folder: Path, code: int) -> dict:
    m = RunResult.load(folder)
    pfc = json.loads((folder / "pfc.json").read_text()) if (folder / "pfc.json").exists() \
        else None
    rows = {e["what"].split(",")[0]: e for e in m.expected or []}
    pause = rows.get("XOFF frames/s")
    return {"ok": code == 0 and m.ok, "folder": str(folder),
            "fidelity": m.fidelity.verdict if m.fidelity else "n/a",
            "jct_over_bound": m.jct_over_ideal,
            "lossless_drops": pfc["totals"]["drops"] if pfc and pfc.get("enabled") else None,
            "fabric_drops": m.links.drops,
            "headroom": (pfc.get("headroom") or {}).get("verdict")
            if pfc and pfc.get("enabled") else "-",
            "xoff_per_s": pause and pause["measured"],
            "xoff_model": pause and (pause["low"], pause["high"]),
            "split": split_sums(folder / "flows.csv")}


def split_sums(flows_csv: Path) -> dict | None:
    """Over every send flow: the parts on its timeline over its FCT (min, max) and the
    smallest share its causes explain (unexplained_s left out)."""
    with open(flows_csv) as fh:
        rows = [r for r in csv.DictReader(fh)
                if r["role"] == "send" and r.get("unexplained_s") and float(r["fct_s"]) > 0]
    if not rows:
        return None
    sums = [sum(float(r[p]) for p in (*PARTS, "unexplained_s")) / float(r["fct_s"])
            for r in rows]
    explained = [sum(float(r[p]) for p in PARTS) / float(r["fct_s"]) for r in rows]
    return {"flows": len(rows), "min": min(sums), "max": max(sums),
            "explained_min": min(explained)}


def _range(values: list[float], spec: str = ".3f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return format(lo, spec) if lo == hi else f"{lo:{spec}}-{hi:{spec}}"


def print_table(done: list[Item]) -> None:
    print(f"{'item':<20} {'what':<40} {'runs':>4} {'lossless drops':>14} "
          f"{'JCT/bound':>11} {'XOFF/s':>9} {'model XOFF/s':>14} {'headroom':>10}  fidelity")
    for it in done:
        rs = [r for r in it.results if r["ok"]]
        failed = len(it.results) - len(rs)
        drops = [r["lossless_drops"] for r in rs]
        model = [r["xoff_model"] for r in rs if r["xoff_model"]]
        span = (f"{min(m[0] for m in model):.0f}-{max(m[1] for m in model):.0f}"
                if model else "n/a")
        print(f"{it.name:<20} {it.what:<40} {len(rs):>4} "
              f"{(_range(drops, 'd') if None not in drops else 'PFC off'):>14} "
              f"{_range([r['jct_over_bound'] for r in rs]):>11} "
              f"{_range([r['xoff_per_s'] for r in rs], '.0f'):>9} "
              f"{span:>14} "
              f"{','.join(sorted({str(r['headroom']) for r in rs})):>10}  "
              f"{','.join(r['fidelity'] for r in rs)}"
              + (f"  ({failed} FAILED: {[r['error'] for r in it.results if not r['ok']]})"
                 if failed else ""))


def record(done: list[Item]) -> tuple[dict, list[tuple[str, bool]]]:
    """bench.json's figures and the goals, met or not."""
    rec: dict = {}
    goals: list[tuple[str, bool]] = []
    for it in done:
        rs = [r for r in it.results if r["ok"]]
        rec[f"pfc_{it.name}_fidelity"] = ", ".join(sorted({r["fidelity"] for r in rs}))
        if not rs:
            goals.append((f"{it.name} completed", False))
            continue
        if it.name == "lossy15":
            splits = [r["split"] for r in rs if r["split"]]
            if splits:
                lo, hi = min(s["min"] for s in splits), max(s["max"] for s in splits)
                rec["attribution_sum_over_fct"] = round(hi if hi - 1 > 1 - lo else lo, 4)
                rec["attribution_sum_over_fct_min"] = round(lo, 4)
                rec["attribution_sum_over_fct_max"] = round(hi, 4)
                rec["attribution_explained_min"] = round(min(s["explained_min"]
                                                             for s in splits), 4)
                goals.append(("every flow's split over its FCT in 0.95-1.05",
                              SUM_GOAL[0] <= lo and hi <= SUM_GOAL[1]))
            continue
        worst = max(r["lossless_drops"] for r in rs)
        rec[f"pfc_{it.name}_lossless_drops"] = worst
        goals.append((f"{it.name} lossless drops 0", worst == 0))
        if it.name == "incast15":
            ratios = [r["jct_over_bound"] for r in rs]
            rec["pfc_incast15_jct_over_bound"] = round(max(ratios), 4)
            rec["pfc_incast15_jct_over_bound_min"] = round(min(ratios), 4)
            goals.append((f"incast15 JCT / bound <= {JCT_GOAL}", max(ratios) <= JCT_GOAL))
    return rec, goals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of the 15:1 incast")
    ap.add_argument("--quick", action="store_true",
                    help=f"one run each of {QUICK_MESSAGE} B, no 31:1 (a smoke test)")
    ap.add_argument("--message-bytes", type=int, default=MESSAGE, help="bytes per flow")
    ap.add_argument("--only", nargs="+", help="these items only (names as printed)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' results folders "
                    "(under results/bench_lossless)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_lossless: needs root (builds fabrics)", file=sys.stderr)
        return 2
    if args.runs < 1:
        print(f"bench_lossless: --runs: {args.runs} is not a number of runs (>= 1)",
              file=sys.stderr)
        return 2
    base = ROOT / "results" / "bench_lossless" if args.keep \
        else Path(tempfile.mkdtemp(prefix="aft-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    todo = items(args)
    for it in todo:
        for k in range(it.runs):
            print(f"  {it.name} run {k + 1} of {it.runs}", file=sys.stderr)
            it.results.append(run_once(it, base, len(it.results)))
    print(f"# lossless class and incast bound, {'quick' if args.quick else 'full'}; "
          f"{machine_line()}")
    print("# bound: n S / B (the runs' ideal); htsim's 15:1 incast of 2 MB flows: "
          "2478.5 / 2400 us = 1.033 (uet-htsim validate_outputs); model XOFF/s: the fluid "
          "on/off cycle at the receiver's switch, o in [0, headroom] (docs/lossless.md)")
    print_table(todo)
    rec, goals = record(todo)
    if "attribution_sum_over_fct_min" in rec:
        print(f"lossy15: every flow's parts on its timeline over its FCT "
              f"{rec['attribution_sum_over_fct_min']:.3f}-"
              f"{rec['attribution_sum_over_fct_max']:.3f}; its causes explain at least "
              f"{rec['attribution_explained_min']:.1%} of a "
              "flow's time")
    print("goals: " + "; ".join(f"{g}: {'met' if met else 'NOT met'}" for g, met in goals))
    if not args.quick:
        update_bench_json(args.out, rec)
        print(f"recorded in {args.out}")
    print(json.dumps({"figures": rec, "goals": dict(goals)}, sort_keys=True))
    return 0 if all(met for _, met in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
