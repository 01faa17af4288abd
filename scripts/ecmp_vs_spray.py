#!/usr/bin/env python3
"""ECMP vs flowlets vs packet spraying on a rail-optimized fabric (claim 1).

Claim: static ECMP hashing of a few elephant flows collides and raises JCT and tail
latency; packet spraying with reordering at the receiver removes it.

Runs, on the same fabric and seed, for each entropy mode (ecmp, flowlet, spray):
  - elephants: every GPU s<i>g<k> sends to s<i+1>g<k+1> (cross server, cross rail, so
    every flow crosses a spine);
  - a ring all-reduce over every GPU.
ECMP and flowlets use the RoCE transport (in order); spraying uses the UET-style
transport, which accepts out-of-order packets.

Claim 1 is about collisions, so every run is lossless by its buffers: each port's
queue holds twice the window of every elephant that can meet there (2 x a leaf's
`servers` flows x window x frame: go-back-N may resend a window that still queues),
since colliding go-back-N flows that overflow a drop-tail queue collapse, which would
mix a second effect into the comparison. (PFC would avoid the loss too, but its
pauses would then set part of the pace; deep buffers leave collisions alone.) The
collapse is shown as a row of its own: the ECMP elephants again on the default 128 KB
queues. Each JCT is printed beside what the collisions predict: an uplink carrying k
elephants gives each 1/k of it, so the job takes max(1, k_max x host rate / uplink
rate) x S/B (k from the measured bytes on every leaf->spine uplink); spraying spreads
them evenly: flows per leaf / spines instead of k_max.

Writes one folder with each run's folder inside, plots (spine-link load heat map, JCT
per mode, latency CDFs) and summary.md stating the finding in numbers.

    sudo .venv/bin/python scripts/ecmp_vs_spray.py [--server-count 4 --gpus 4 --spines 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.expect import Expectation, expectation_lines, ring_allreduce
from testbed.experiment import from_toml, rate_arg
from testbed.fidelity import worst_verdict
from testbed.results import (
    finish_script,
    marks_failure,
    new_folder,
    percentile,
    read_tables,
    save_plot,
    script_exit,
)
from testbed.run import run, script_rate
from testbed.script_args import add_rate, add_server_count
from topologies.physics import ROCE_FRAME_BYTES
from traffic.transport_settings import TransportSettings

ROOT = Path(__file__).resolve().parent.parent

MODES = {"ecmp": "roce", "flowlet": "roce", "spray": "uet"}
LOSSY = "ecmp, shallow"      # the loss-collapse row: ECMP elephants on default queues
COLLISION_SOURCE = "max-min fair share of a link among k flows (Bertsekas & Gallager 6.5)"


def elephant_pairs(servers: int, gpus: int) -> list[str]:
    return [f"s{s}g{k}>s{(s + 1) % servers}g{(k + 1) % gpus}"
            for s in range(servers) for k in range(gpus)]


def deep_queue_bytes(servers: int) -> int:
    """A queue that holds every window that can meet in it: a leaf's `servers`
    elephants, each with a full window of frames in flight, twice over (go-back-N may
    resend a window while its first copies still wait in the queue)."""
    return 2 * servers * TransportSettings().window_packets * ROCE_FRAME_BYTES


def settings(base: Path, args: dict, mode: str, workload: str, deep: bool) -> dict:
    """One run's experiment settings (`args`: the script's arguments, as a dict)."""
    # the builder's own rates (rails 100 Mbit/s, NVLink 900: x4000 of the real ones); the
    # run's `rate` rescales every link by one factor (testbed.rate.rescaled), so the
    # NVLink and uplinks keep their real ratios to the rails at any rate
    params = {"servers": args["servers"], "gpus_per_server": args["gpus"],
              "spines": args["spines"]}
    if deep:
        params["queue_bytes"] = deep_queue_bytes(args["servers"])
    topology = {"name": "rail", "kind": "rail_optimized", "params": params}
    out = {"name": f"{workload}_{mode}", "workload": workload,
           "message_bytes": args["message_bytes"], "iterations": args["iterations"],
           "transport": MODES[mode], "entropy": mode, "seed": args["seed"],
           "results_dir": str(base), "timeout_s": 300.0, "rto_ms": 200.0,
           "topology": topology, "rate": args["rate_mbps"]}
    if not deep:
        out["name"] += "_shallow"
    if workload == "p2p":
        out["pairs"] = elephant_pairs(args["servers"], args["gpus"])
    return out


def run_mode(base: Path, args, mode: str, workload: str, deep: bool) -> dict:
    print(f"== {workload}, {mode} ({MODES[mode]}), {'deep' if deep else 'default'} queues",
          flush=True)
    folder, metrics = run(from_toml(None, settings(base, vars(args), mode, workload, deep)),
                          progress=lambda m: print(f"   {m}", file=sys.stderr, flush=True))
    latencies, _ = read_tables(folder)
    return {"folder": folder, "metrics": metrics, "latency_us": latencies}


def plots(folder: Path, results: dict) -> list[Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = []
    modes = list(MODES)
    # heat map: bytes on every leaf->spine uplink during the elephants, per mode
    links = sorted({f"{leaf}>{spine}" for m in modes for leaf, spines in
                    results["p2p", m]["metrics"]["links"]["uplink_bytes"].items()
                    for spine in spines})
    grid = []
    for m in modes:
        up = results["p2p", m]["metrics"]["links"]["uplink_bytes"]
        row = [up[name.split(">")[0]][name.split(">")[1]] / 1e6 for name in links]
        grid.append(row)
    fig = Figure(figsize=(max(6, 0.45 * len(links) + 2), 3.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(modes)), modes)
    ax.set_xticks(range(len(links)), links, rotation=60, ha="right", fontsize=7)
    ax.set_title("elephants: MB sent on each leaf->spine uplink (measured)")
    fig.colorbar(im, ax=ax, label="MB")
    out.append(save_plot(fig, folder, "spine_load_heatmap.png"))
    # JCT per mode: elephants (slowest flow) and all-reduce (mean JCT)
    fig = Figure(figsize=(6, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.38
    for j, (workload, label) in enumerate((("p2p", "elephants: job time"),
                                           ("allreduce", "ring all-reduce: JCT"))):
        vals = [results[workload, m]["metrics"]["jct_mean_s"] for m in modes]
        ax.bar([i + (j - 0.5) * width for i in range(len(modes))], vals, width, label=label)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("seconds (measured, mean of iterations)")
    ax.set_title("completion time per entropy mode")
    ax.legend()
    out.append(save_plot(fig, folder, "jct_per_mode.png"))
    # latency CDFs
    fig = Figure(figsize=(6, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for m in modes:
        lat = sorted(results["p2p", m]["latency_us"])
        if lat:
            ax.plot([v / 1e3 for v in lat], [(i + 1) / len(lat) for i in range(len(lat))],
                    label=f"{m} (p99 {percentile(lat, 99) / 1e3:.1f} ms)")
    ax.set_xlabel("one-way packet latency (ms, measured)")
    ax.set_ylabel("CDF")
    ax.set_title("elephants: packet latency per mode")
    ax.grid(True, alpha=0.3)
    ax.legend()
    out.append(save_plot(fig, folder, "latency_cdf.png"))
    return out


def flows_per_uplink(metrics: dict, flows: int) -> list[float]:
    """Elephants on each leaf->spine uplink, from the bytes measured on it: every
    elephant crosses exactly one uplink, so a flow's share is total / flows. Each
    iteration is a new flow with new source ports, so over several iterations this is
    the mean per iteration (not a whole number when the hash fell differently)."""
    up = [b for spines in metrics["links"]["uplink_bytes"].values() for b in spines.values()]
    per_flow = sum(up) / flows if flows else 0
    return [round(b / per_flow, 2) for b in up] if per_flow else []


def expectations(results: dict, args) -> list[Expectation]:
    flows = args.servers * args.gpus
    per_leaf = args.servers            # elephants leaving each rail's leaf
    up_mbps = args.servers * args.rate_mbps / args.spines   # the builder's uplink rate
    ratio = args.rate_mbps / up_mbps
    out = []
    for mode in MODES:
        m = results["p2p", mode]["metrics"]
        k = flows_per_uplink(m, flows)
        k_max = max(k) if k else 0
        if mode == "spray":
            k_exp = max(1.0, per_leaf / args.spines * ratio)
            formula = (f"max(1, {per_leaf} flows per leaf / {args.spines} spines x "
                       f"{args.rate_mbps:g}/{up_mbps:g} Mbit/s) x S/B")
        else:
            k_exp = max(1.0, k_max * ratio)
            formula = (f"max(1, k_max x {args.rate_mbps:g}/{up_mbps:g} Mbit/s) x S/B, k_max = "
                       f"{k_max:g} elephants on the busiest uplink (per uplink: "
                       f"{', '.join(f'{x:g}' for x in k)}"
                       + (", mean over iterations)" if args.iterations > 1 else ")"))
        why = _why(m) + (f"; slowest flow {m['flows']['fct_max_s']:.3f} s: each iteration "
                         "draws new source ports, so its collisions differ from the mean, and "
                         "a JCT also spans the flows' start skew" if args.iterations > 1 else "")
        out.append(Expectation(f"elephants, {mode}", formula, COLLISION_SOURCE,
                               k_exp * m["ideal_s"], k_exp * m["ideal_s"], m["jct_mean_s"],
                               "s", why_not=why))
    for mode in MODES:
        m = results["allreduce", mode]["metrics"]
        out.append(ring_allreduce(
            f"ring all-reduce, {mode}", m["ideal_s"], m["jct_mean_s"],
            why_not=f"uplink max/mean {m['links']['uplink_max_over_mean']:.2f}: ring "
                    "neighbours' flows share uplinks; " + _why(m),
            formula="2(n-1)/n x S/B (no collision)"))
    lossy = results.get(("p2p", LOSSY))
    if lossy:
        m = lossy["metrics"]
        k = flows_per_uplink(results["p2p", "ecmp"]["metrics"], flows)
        k_exp = max(1.0, max(k) * ratio) if k else 0
        out.append(Expectation(
            "elephants, ECMP on default queues", "as lossless ECMP, if loss cost nothing",
            COLLISION_SOURCE, k_exp * m["ideal_s"], k_exp * m["ideal_s"],
            m["jct_mean_s"], "s", why_not="loss collapse: " + _why(m)))
    return out


def _why(m: dict) -> str:
    f = m["flows"]
    return (f"{m['links']['drops']} drops, {f['retransmits']} retransmits, "
            f"{f['timeouts']} timeouts, fidelity {m['fidelity']['verdict']}")


def summary(results: dict, args) -> tuple[str, dict]:
    m = {key: r["metrics"] for key, r in results.items()}
    lat = {mode: results["p2p", mode]["latency_us"] for mode in MODES}
    numbers = {}
    for mode in MODES:
        numbers[mode] = {
            "elephants_jct_s": m["p2p", mode]["jct_mean_s"],
            "allreduce_jct_s": m["allreduce", mode]["jct_mean_s"],
            "allreduce_jct_over_ideal": m["allreduce", mode]["jct_over_ideal"],
            "uplink_max_over_mean": m["p2p", mode]["links"]["uplink_max_over_mean"],
            "latency_p50_us": percentile(lat[mode], 50),
            "latency_p99_us": percentile(lat[mode], 99),
            "latency_p999_us": percentile(lat[mode], 99.9),
            "retransmits": m["p2p", mode]["flows"]["retransmits"]
            + m["allreduce", mode]["flows"]["retransmits"],
            "drops": m["p2p", mode]["links"]["drops"] + m["allreduce", mode]["links"]["drops"],
            "fidelity": worst_verdict(m[w, mode] for w in ("p2p", "allreduce")),
        }
    lossy = m.get(("p2p", LOSSY))
    if lossy:
        numbers[LOSSY] = {
            "elephants_jct_s": lossy["jct_mean_s"],
            "uplink_max_over_mean": lossy["links"]["uplink_max_over_mean"],
            "retransmits": lossy["flows"]["retransmits"], "drops": lossy["links"]["drops"],
            "timeouts": lossy["flows"]["timeouts"],
            "fidelity": lossy["fidelity"]["verdict"]}
    e, s = numbers["ecmp"], numbers["spray"]

    def cut(a, b):
        return 100 * (a - b) / a if a else 0.0

    lines = [
        "# ECMP vs flowlets vs packet spraying", "",
        f"rail-optimized, {args.servers} servers x {args.gpus} GPUs, {args.spines} spines, "
        f"{args.rate_mbps:g} Mbit/s links; {args.message_bytes} B per flow/rank, "
        f"{args.iterations} iterations, seed {args.seed}, "
        + (f"queues of {deep_queue_bytes(args.servers)} B (every colliding window fits: "
           "the comparison isolates load balancing from loss)" if args.buffers == "deep"
           else "default queues (loss and load balancing mixed)")
        + ". ECMP and flowlets use RoCE (in order); "
        "spraying uses the UET-style transport (out-of-order accepted).", "",
        f"**Finding:** spraying cut the elephants' job time by "
        f"{cut(e['elephants_jct_s'], s['elephants_jct_s']):.0f}% and the all-reduce JCT by "
        f"{cut(e['allreduce_jct_s'], s['allreduce_jct_s']):.0f}% vs static ECMP; max "
        f"leaf->spine load {e['uplink_max_over_mean']:.2f}x the mean under ECMP, "
        f"{s['uplink_max_over_mean']:.2f}x under spraying; p99 latency "
        f"{e['latency_p99_us'] / 1e3:.1f} ms vs {s['latency_p99_us'] / 1e3:.1f} ms.", "",
        "| mode | elephants (s) | all-reduce JCT (s) | JCT / ideal | uplink max/mean | "
        "p50 / p99 / p99.9 latency (ms) | retransmits | drops | fidelity |",
        "|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        n = numbers[mode]
        lines.append(
            f"| {mode} | {n['elephants_jct_s']:.3f} | {n['allreduce_jct_s']:.3f} | "
            f"{n['allreduce_jct_over_ideal']:.2f} | {n['uplink_max_over_mean']:.2f} | "
            f"{n['latency_p50_us'] / 1e3:.1f} / {n['latency_p99_us'] / 1e3:.1f} / "
            f"{n['latency_p999_us'] / 1e3:.1f} | {n['retransmits']} | {n['drops']} | "
            f"{n['fidelity']} |")
    if lossy:
        n = numbers[LOSSY]
        lines += ["", f"Loss collapse, its own row: the ECMP elephants on the default drop-tail "
                  f"queues took {n['elephants_jct_s']:.3f} s against {e['elephants_jct_s']:.3f} "
                  f"s lossless, with {n['drops']} drops, {n['retransmits']} retransmits and "
                  f"{n['timeouts']} timeouts (go-back-N resends a window per loss)."]
    expected = expectations(results, args)
    numbers["expected"] = [x.to_dict() for x in expected]
    lines += expectation_lines(expected)
    lines += ["", "Runs (each a full results folder with pcaps-ready data): "
              + ", ".join(sorted(r["folder"].name for r in results.values()))]
    return "\n".join(lines) + "\n", numbers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_count(ap)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per server (= rails)")
    ap.add_argument("--spines", type=int, default=2)
    add_rate(ap, type=rate_arg, default="auto", metavar="MBPS|auto",
             help="endpoint link rate; auto (default): the highest at which every run "
             "should stay faithful on this machine (its calibration, measured first "
             "if none is cached: 'testbed calibrate'), one for all")
    ap.add_argument("--message-bytes", type=int, default=2 << 20)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--buffers", choices=("deep", "default"), default="deep",
                    help="deep: queues hold every colliding window, so no loss mixes into "
                         "the comparison (default); default: the topology's 128 KB queues")
    ap.add_argument("--no-lossy-row", action="store_true",
                    help="skip the extra ECMP run on default queues (the loss-collapse row)")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    for name in ("servers", "gpus", "spines", "iterations", "message_bytes"):
        if getattr(args, name) < (2 if name in ("servers", "gpus") else 1):
            flag = "server-count" if name == "servers" else name.replace("_", "-")
            ap.error(f"--{flag} is too small")
    args.rate_mbps = script_rate(args.rate_mbps, lambda rate: [
        from_toml(None, settings(Path(args.results), {**vars(args), "rate_mbps": rate}, mode,
                                 workload, args.buffers == "deep"))
        for mode in MODES for workload in ("p2p", "allreduce")])
    folder = new_folder(args.results, "ecmp_vs_spray")
    results = {}
    with marks_failure(folder):
        for mode in MODES:
            for workload in ("p2p", "allreduce"):
                results[workload, mode] = run_mode(folder, args, mode, workload,
                                                   args.buffers == "deep")
        if args.buffers == "deep" and not args.no_lossy_row:
            results["p2p", LOSSY] = run_mode(folder, args, "ecmp", "p2p", False)
    made = plots(folder, results)
    text, numbers = summary(results, args)
    return finish_script(folder, text, numbers, made)


if __name__ == "__main__":
    sys.exit(script_exit(main))
