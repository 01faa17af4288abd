#!/usr/bin/env python3
"""Benchmark: a training step on real packets against its analytic time, and a plan
against its own Chakra traces.

The job: a 16-GPU dense model, TP 4 inside each server and DP 4 along the rails, on
rail_optimized (4 servers x 4 GPUs) at the rate this machine's calibration picks
(`--rate auto`), one step per run. Each round runs the plan, then its Chakra traces
(the plan's run writes them into its folder; `--trace` replays them at the same byte
scale), alternated --rounds times.

    train_step_over_analytic   measured step / analytic step (the plan's runs; median,
                               min-max), counted only where the run's verdict is faithful
    train_step_wall_s_per_step wall seconds a step takes here (the emulated step)
    train_step_trace_vs_plan   |trace step - plan step| / plan step, per round (median)

Merges into results/bench.json with the machine's calibration.

    sudo .venv/bin/python scripts/bench_train.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from testbed.benchmarks import machine_line, rate_auto, update_bench_json
from testbed.experiment import from_toml, rate_arg
from testbed.run import ensure_calibration, run
from testbed.script_args import add_rate

ROOT = Path(__file__).resolve().parent.parent
PLAN = {"tp": 4, "layers": 4}


def one(tmp: Path, name: str, rate, **kw) -> tuple[Path, dict]:
    exp = from_toml(None, {"name": name, "workload": "train_step", "iterations": 1,
                           "rate": rate, "results_dir": str(tmp), "timeout_s": 600.0,
                           "topology": "rail_optimized", **PLAN, **kw})
    return run(exp, progress=lambda s: None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternated repetitions")
    add_rate(ap, type=rate_arg, default="auto", metavar="MBPS|auto",
             help="the links' rate (auto: what this machine's calibration picks)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print("bench_train: --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.rate_mbps == "auto":
        ensure_calibration()   # cached per machine: --rate auto needs it
    print(f"# a training step (TP 4 x DP 4, rail_optimized), plan and its Chakra traces, "
          f"x{args.rounds}; {machine_line()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            folder, plan = one(Path(tmp), f"plan{r}", args.rate_mbps)
            _, trace = one(Path(tmp), f"trace{r}", args.rate_mbps, trace=str(folder / "trace"),
                           byte_scale=plan["train"]["byte_scale"])
            row = {"rate_mbps": plan["rate_choice"]["rate_mbps"] if plan["rate_choice"]
                   else args.rate_mbps, "plan": plan["train"], "trace": trace["train"],
                   "verdicts": (plan["fidelity"]["verdict"], trace["fidelity"]["verdict"]),
                   "exactly_once": plan["flows"]["exactly_once"]
                   and trace["flows"]["exactly_once"]}
            rows.append(row)
            print(f"round {r + 1}/{args.rounds}: plan {row['plan']['step_mean_s']:.3f} s "
                  f"({row['plan']['step_over_analytic']:.3f}x analytic), trace "
                  f"{row['trace']['step_mean_s']:.3f} s at {row['rate_mbps']} Mbit/s; "
                  f"{', '.join(row['verdicts'])}", file=sys.stderr)
    faithful = [x for x in rows if x["verdicts"][0] == "faithful"] or rows
    over = [x["plan"]["step_over_analytic"] for x in faithful]
    wall = [x["plan"]["step_mean_s"] for x in rows]
    diff = [abs(x["trace"]["step_mean_s"] - x["plan"]["step_mean_s"])
            / x["plan"]["step_mean_s"] for x in rows]
    print("\n| round | rate Mbit/s | plan step s | trace step s | analytic s | plan / analytic "
          "| verdicts |\n|---|---|---|---|---|---|---|")
    for i, x in enumerate(rows):
        print(f"| {i + 1} | {x['rate_mbps']} | {x['plan']['step_mean_s']:.3f} | "
              f"{x['trace']['step_mean_s']:.3f} | {x['plan']['analytic_step_s']:.3f} | "
              f"{x['plan']['step_over_analytic']:.3f} | {', '.join(x['verdicts'])} |")
    print(f"\ntrain_step_over_analytic = {statistics.median(over):.3f} ({min(over):.3f}-"
          f"{max(over):.3f}; goal <= 1.10: the analytic step is each rank's compute plus "
          "the communication its overlap leaves, every transfer alone on its links at the "
          "nccl-tests bus bandwidth)")
    print(f"train_step_trace_vs_plan = {statistics.median(diff):.4f} (goal < 0.02: the "
          "same job, read back from its Chakra traces)")
    print(f"train_step_wall_s_per_step = {statistics.median(wall):.2f} s per step at "
          f"{rows[0]['rate_mbps']} Mbit/s (the real step: "
          f"{rows[0]['plan']['step_mean_s_real'] * 1e3:.2f} ms)")
    update_bench_json(args.out, {
        "train_step_over_analytic": round(statistics.median(over), 3),
        "train_step_over_analytic_min": round(min(over), 3),
        "train_step_over_analytic_max": round(max(over), 3),
        "train_step_trace_vs_plan": round(statistics.median(diff), 4),
        "train_step_trace_vs_plan_max": round(max(diff), 4),
        "train_step_wall_s_per_step": round(statistics.median(wall), 2),
        "train_step_rate_mbps": rows[0]["rate_mbps"],
        "train_step_verdicts": [v for x in rows for v in x["verdicts"]],
        **(rate_auto("bench_train", [v for x in rows for v in x["verdicts"]])
           if args.rate_mbps == "auto" else {})})
    return 0 if all(x["exactly_once"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
