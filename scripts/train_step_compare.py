#!/usr/bin/env python3
"""One training step on rail-optimized, rail-only and one-tier fabrics; ECMP vs spraying;
PFC vs DCQCN (claim 4 on a job instead of a single collective).

The plan (traffic/train.py): a dense model with TP inside each server and DP along the
rails, and its mixture-of-experts variant whose expert parallelism puts an all-to-all
over the rails before and after every MoE layer. Each runs as a `train_step` workload
(compute on each rank's stream, every collective and pipeline send on real packets) on
each fabric, with each load balancing and each lossless setting; every run of one model
runs the same scaled job (one byte scale for all, chosen on the first). Reports per run
the step time, measured and scaled back, and the slowest rank's split (compute, exposed
collectives, idle), beside the analytic step (each rank's compute plus the communication
the overlap does not hide, every transfer alone on its links: nccl-tests' formulas).

Claim (Wang et al., "How to Build Low-cost Networks for Large Language Models", 2023):
a rail-only fabric trains as fast as rail-optimized, since TP stays in the NVLink domain
and DP on a rail; only traffic that crosses rails (MoE's all-to-all) pays, 8.2-11.2 % of
an all-to-all's time.

    sudo .venv/bin/python scripts/train_step_compare.py [--server-count 4 --gpus 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from topology_compare import lossless_sizing

from testbed.expect import Expectation, expectation_lines
from testbed.experiment import from_toml, rate_arg
from testbed.outputs import save_plot
from testbed.results import finish_script, marks_failure, new_folder, script_exit
from testbed.run import run, script_rate
from testbed.script_args import add_rate, add_server_count
from topologies.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"dense": {}, "moe": {"experts": 8, "top_k": 2}}
FABRICS = ("rail_optimized", "rail_only", "one_tier")
ENTROPIES = ("ecmp", "spray")
CCS = ("pfc", "dcqcn")
PUBLISHED_A2A_OVERHEAD = (8.2, 11.2)          # percent, Wang et al. 2023
NOISE_POINTS = 2.0      # percent: two runs of one job differ this much (run noise)
WANG = "Wang et al., How to Build Low-cost Networks for LLMs, arXiv:2307.12169 (2023)"
STEP_FORMULA = ("compute per rank (24bsh^2(1+s/6h) FLOPs per layer, x3 with backward) + "
                "what the overlap leaves of 2(n-1)/n S/B rings, (n-1)/n S/B all-to-alls")
STEP_SOURCE = "Narayanan et al. SC'21 (FLOPs); nccl-tests PERFORMANCE.md (bus bandwidth)"


def topology(fabric: str, servers: int, gpus: int) -> dict:
    if fabric == "one_tier":
        return {"kind": "one_tier", "params": {"nodes": servers * gpus, "planes": 1}}
    extra = {"spines": 2} if fabric == "rail_optimized" else {}
    return {"kind": fabric, "params": {"servers": servers, "gpus_per_server": gpus, **extra}}


def experiments(args, rate_mbps: float, folder: Path, byte_scale="auto") -> list:
    """Every run: model x fabric x entropy x lossless setting."""
    out = []
    for model in args.models:
        plan = {"tp": args.gpus, "layers": args.layers, "hidden_size": args.hidden,
                "seq_len": args.seq_len, **MODELS[model]}
        if model == "moe":
            plan["ep"] = args.servers
        for fabric in args.fabrics:
            spec = {"name": fabric, **topology(fabric, args.servers, args.gpus)}
            for entropy in args.entropies:
                for cc in args.ccs:
                    settings = {
                        "name": f"{model}_{fabric}_{entropy}_{cc}", "workload": "train_step",
                        "iterations": args.iterations, "seed": args.seed,
                        "entropy": entropy, "transport": "roce", "pfc": "on",
                        **({"ecn": "on", "cc": "dcqcn"} if cc == "dcqcn" else {}),
                        "results_dir": str(folder), "timeout_s": 600.0, "rate": rate_mbps,
                        "topology": spec, "byte_scale": byte_scale, **plan}
                    buffer, headroom = lossless_sizing(from_toml(None, settings))
                    out.append(from_toml(None, {
                        **settings, "pfc_headroom_bytes": headroom,
                        "topology": {**spec, "params": {**spec["params"],
                                                        "queue_bytes": buffer}}}))
    return out


def why(m: dict) -> str:
    """What in a run breaks the analytic model's assumption (transfers alone on links)."""
    out = []
    ups = m["links"].get("uplink_max_over_mean")
    if ups and ups > 1.2:
        out.append(f"ECMP put {ups:.2f}x the mean on one uplink")
    if m["flows"]["retransmits"]:
        out.append(f"{m['flows']['retransmits']} retransmits")
    paused = (((m.get("pfc") or {}).get("totals")) or {}).get("paused_s") or 0
    if paused:
        out.append(f"PFC paused ports {paused:.2f} s in all")
    cc = m.get("cc") or {}
    if cc.get("ce_packets"):
        out.append(f"{cc['ce_packets']} CE marks cut DCQCN senders to "
                   f"{cc['lowest_rate_fraction']:.0%} of their line rate at the lowest, "
                   "regained at the scaled timers' pace")
    if m["fidelity"]["verdict"] != "faithful":
        out.append(f"fidelity {m['fidelity']['verdict']}")
    return ", ".join(out) or "no sharing, pause, mark or loss seen"


def split_of(m: dict) -> dict:
    last = m["train"]["iterations"][-1]
    return last["ranks"][last["slowest_rank"]]


def plot(folder: Path, rows: list[tuple[str, dict]]) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(rows) + 2), 4.6))
    parts = (("compute_s", "compute", "#4c72b0"),
             ("exposed_comm_s", "exposed collectives", "#dd8452"),
             ("pipeline_wait_s", "pipeline waits", "#8172b3"), ("idle_s", "idle", "#cccccc"))
    names = [name for name, _ in rows]
    bottom = [0.0] * len(rows)
    for key, label, color in parts:
        vals = [m["train"]["step_mean_s_real"] / m["train"]["step_mean_s"] * split_of(m)[key]
                * 1e3 for _, m in rows]
        ax.bar(names, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("step time, scaled back to the real fabric (ms)")
    ax.set_title("Training step: the slowest rank's time, by what filled it")
    ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    ax.legend(fontsize=8)
    return save_plot(fig, folder, "step_split.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_count(ap)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per server (the TP degree)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096, help="hidden size")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--models", default="dense,moe", help="dense, moe")
    ap.add_argument("--fabrics", default=",".join(FABRICS))
    ap.add_argument("--entropies", default=",".join(ENTROPIES))
    ap.add_argument("--ccs", default=",".join(CCS), help="pfc (PFC alone), dcqcn (PFC + ECN "
                    "+ DCQCN)")
    add_rate(ap, type=rate_arg, default="auto", metavar="MBPS|auto")
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    for key, allowed in (("models", tuple(MODELS)), ("fabrics", FABRICS),
                         ("entropies", ENTROPIES), ("ccs", CCS)):
        got = [v.strip() for v in getattr(args, key).split(",") if v.strip()]
        bad = [v for v in got if v not in allowed]
        if bad or not got:
            ap.error(f"--{key}: {', '.join(bad) or 'nothing'} is not one of "
                     f"{', '.join(allowed)}")
        setattr(args, key, got)
    if args.servers < 2 or args.gpus < 2:
        ap.error("--server-count and --gpus must be at least 2")
    try:
        args.rate_mbps = script_rate(args.rate_mbps,
                                     lambda rate: experiments(args, rate, Path(args.results)))
    except SpecError as exc:
        ap.error(str(exc))
    folder = new_folder(args.results, "train_step_compare")
    results: dict[str, dict] = {}
    scales: dict[str, float] = {}
    with marks_failure(folder):
        for exp in experiments(args, args.rate_mbps, folder):
            model = exp.name.split("_")[0]
            if model in scales:          # one job for every run of a model
                exp.byte_scale = scales[model]
            print(f"== {exp.name}", flush=True)
            _, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
            scales.setdefault(model, m["train"]["byte_scale"])
            results[exp.name] = m
    lines = ["# Training step comparison", "",
             f"{args.servers} servers x {args.gpus} GPUs at {args.rate_mbps:g} Mbit/s per "
             f"rail (NVLink 9x); TP {args.gpus} in each server, DP {args.servers} along the "
             f"rails; {args.layers} layers, hidden {args.hidden}, sequence {args.seq_len}; "
             "MoE: 8 experts, top 2, EP over the rails. RoCE, PFC on in every run. Byte "
             "scale per model: " + ", ".join(f"{k} 1/{v:.4g}" for k, v in scales.items())
             + ".", "",
             "| run | step (s) | real step (ms) | / analytic | compute | exposed coll. | "
             "idle | retransmits | fidelity |", "|---|---|---|---|---|---|---|---|---|"]
    expected = []
    for name, m in results.items():
        t, s = m["train"], split_of(m)
        lines.append(f"| {name} | {t['step_mean_s']:.3f} | {t['step_mean_s_real'] * 1e3:.2f} "
                     f"| {t['step_over_analytic']:.3f} | {s['compute_s']:.3f} | "
                     f"{s['exposed_comm_s']:.3f} | {s['idle_s']:.3f} | "
                     f"{m['flows']['retransmits']} | {m['fidelity']['verdict']} |")
        expected.append(Expectation(
            f"{name}: step time", STEP_FORMULA, STEP_SOURCE, t["analytic_step_s"],
            t["analytic_step_s"], t["step_mean_s"], "s", why_not=why(m)))
    for model in args.models:
        for entropy in args.entropies:
            for cc in args.ccs:
                opt = results.get(f"{model}_rail_optimized_{entropy}_{cc}")
                ro = results.get(f"{model}_rail_only_{entropy}_{cc}")
                if not (opt and ro):
                    continue
                over = 100 * (ro["train"]["step_mean_s"] / opt["train"]["step_mean_s"] - 1)
                hi = PUBLISHED_A2A_OVERHEAD[1] if model == "moe" else NOISE_POINTS
                expected.append(Expectation(
                    f"{model} ({entropy}, {cc}): rail-only step over rail-optimized",
                    "0 when no traffic crosses rails (TP in the server, DP and EP on a "
                    "rail); at most the all-to-all's overhead when it does", WANG,
                    -NOISE_POINTS, hi, over, "%", tolerance=0.0,
                    why_not=f"rail-only: {why(ro)}; rail-optimized: {why(opt)}"))
    lines += expectation_lines(expected)
    lines += ["", "Each run's folder holds its timeline.png (per rank: compute, each "
              "collective, waits) and its job as Chakra traces (trace/)."]
    text = "\n".join(lines) + "\n"
    metrics = {"rate_mbps": args.rate_mbps, "byte_scale": scales,
               "runs": {k: {"step_s": m["train"]["step_mean_s"],
                            "step_s_real": m["train"]["step_mean_s_real"],
                            "analytic_step_s": m["train"]["analytic_step_s"],
                            "step_over_analytic": m["train"]["step_over_analytic"],
                            "slowest": split_of(m), "fidelity": m["fidelity"]["verdict"]}
                        for k, m in results.items()},
               "expected": [e.to_dict() for e in expected]}
    plots = [plot(folder, list(results.items()))]
    return finish_script(folder, text, metrics, plots)


if __name__ == "__main__":
    sys.exit(script_exit(main))
