"""Open-loop flows in a run (workload flows): what their results say against what was
asked (testbed.flow_plan planned them) and what queueing theory predicts.

    agents' flows + attribution's rows ─▶ results: metrics.json "open_loop", flows.csv's
      arrival_s, summary.md's slowdown table by size bucket (as HPCC and Homa print it),
      plots/slowdown.png, and Expected vs measured rows

A flow's slowdown is its FCT over its time alone on an empty fabric (testbed.attribution:
its frames at its path's slowest link plus one frame's store-and-forward per hop).
Expected: the arrival rate and mean size the run produced against what was asked (within
three standard errors of a Poisson count and of a sample mean), and the mean slowdown
against M/G/1 at the senders' load: processor sharing 1 / (1 - rho), FIFO
Pollaczek-Khinchine (testbed.flow_expect); a fabric whose flows share links fairly sits
between the two, nearer PS.
"""

from __future__ import annotations

import csv
import math
import statistics

from testbed import attribution, rpc_run
from testbed.expect import Expectation
from testbed.feature_plots import _figure
from testbed.flow_expect import expected_buckets, pk_wait_s, ps_slowdown
from testbed.link_check import FRAME_OVERHEAD_BYTES
from testbed.outputs import save_plot
from topologies import units
from topologies.stats import percentile
from traffic.open_loop import BACKGROUND_TAG


def _starts(agents: dict[str, dict]) -> dict[int, int]:
    """Each iteration's start (ns): its first agent's."""
    out: dict[int, int] = {}
    for a in agents.values():
        for k, it in enumerate(a["iterations"]):     # in iteration order
            if it.get("start_ns") is not None:
                out[k] = min(out.get(k, it["start_ns"]), it["start_ns"])
    return out


def flow_rows(info: dict, agents: dict[str, dict], split: dict[str, dict]) -> list[dict]:
    """Every finished open-loop send flow: its size, arrival asked and started (s after
    its iteration began), FCT, time alone and slowdown; `split` gains arrival_s."""
    planned = {f.tag: f for f in info["planned"]}
    begun = _starts(agents)
    rows = []
    for node, a in agents.items():
        for f in a["flows"]:
            plan = planned.get(f["tag"])
            if f["role"] != "send" or plan is None or f.get("end_ns") is None:
                continue
            fid = attribution.flow_id(node, f)
            part = split.setdefault(fid, {})
            part["arrival_s"] = plan.arrival_ns / 1e9
            rows.append({"tag": f["tag"], "iteration": f["iteration"],
                         "size_bytes": f["size_bytes"], "arrival_s": plan.arrival_ns / 1e9,
                         "started_s": (f["start_ns"] - begun[f["iteration"]]) / 1e9,
                         "fct_s": (f["end_ns"] - f["start_ns"]) / 1e9,
                         "alone_s": part.get("alone_s"), "slowdown": part.get("slowdown")})
    return rows


def bucket_table(rows: list[dict], model: list) -> list[dict]:
    """Per size bucket (low_bytes, high_bytes] of `model` (testbed.flow_expect's, its
    edges the distribution's): flows, slowdown p50/p95/p99 and the models' mean
    slowdowns."""
    out = []
    for m in model:
        mine = [r["slowdown"] for r in rows if r["slowdown"] is not None
                and m.low_bytes < r["size_bytes"] <= m.high_bytes]
        out.append({"low_bytes": m.low_bytes, "high_bytes": m.high_bytes,
                    "fraction": m.fraction, "flows": len(mine),
                    "p50": percentile(mine, 50), "p95": percentile(mine, 95),
                    "p99": percentile(mine, 99),
                    "fifo_model": None if math.isnan(m.fifo_slowdown) else m.fifo_slowdown,
                    "ps_model": m.ps_slowdown})
    return out


def results(info: dict, agents: dict[str, dict], split: dict[str, dict]) -> dict:
    """metrics.json's "open_loop": what was asked, what was produced, the slowdowns (an
    RPC run's: testbed.rpc_run's)."""
    if info["kind"] == "rpc":
        return rpc_run.results(info, agents, split)
    sizes, load = info["sizes"], info["load"]
    rows = flow_rows(info, agents, split)
    senders = sorted({f.src for f in info["planned"]})
    link_bytes_s = statistics.mean(units.mbps_to_bytes_per_s(info["host_mbps"][h])
                                   for h in senders)
    bits = link_bytes_s * 8
    asked_rate = sum(load * units.mbps_to_bytes_per_s(info["host_mbps"][h])
                     for h in senders) / sizes.mean_bytes()
    per_it: dict[int, list[dict]] = {}
    for r in rows:
        per_it.setdefault(r["iteration"], []).append(r)
    rates, loads = [], []
    for its in per_it.values():
        its.sort(key=lambda r: r["started_s"])
        span = max(r["started_s"] for r in its) - min(r["started_s"] for r in its)
        if len(its) > 1 and span > 0:
            rates.append((len(its) - 1) / span)
            loads.append(sum(r["size_bytes"] for r in its[:-1]) / span
                         / (link_bytes_s * len(senders)))
    late = [r["started_s"] - r["arrival_s"] for r in rows]
    model = expected_buckets(sizes, load, bits)
    slow = [r["slowdown"] for r in rows if r["slowdown"] is not None]
    beyond = [r["fct_s"] - r["alone_s"] for r in rows if r["alone_s"]]
    bg = [(node, f) for node, a in agents.items() for f in a["flows"]
          if f["role"] == "send" and f["tag"].startswith(BACKGROUND_TAG + ".")
          and f.get("end_ns") is not None]
    return {
        "kind": "flows", "sizes": sizes.name, "source": sizes.source, "load": load,
        "destinations": info["destinations"], "senders": len(senders),
        "flows_asked": len(info["planned"]), "flows_done": len(rows),
        "arrival_rate_asked_per_s": asked_rate,
        "arrival_rate_per_s": statistics.mean(rates) if rates else None,
        "mean_size_asked_bytes": sizes.mean_bytes(),
        "mean_size_bytes": statistics.mean(r["size_bytes"] for r in rows) if rows else None,
        "size_cv": math.sqrt(max(0.0, sizes.second_moment() / sizes.mean_bytes() ** 2 - 1)),
        "load_produced": statistics.mean(loads) if loads else None,
        "start_late_p50_s": percentile(late, 50), "start_late_p99_s": percentile(late, 99),
        "slowdown_mean": statistics.mean(slow) if slow else None,
        "slowdown_p50": percentile(slow, 50), "slowdown_p99": percentile(slow, 99),
        "ps_slowdown": ps_slowdown(load), "rate_bytes_per_s": link_bytes_s,
        # the agents' interrupt moderation: how long an end may hold a flow's packet
        "moderation_s": info["coalesce_frames"] * (info["payload_bytes"]
                                                   + FRAME_OVERHEAD_BYTES) / link_bytes_s,
        "pk_wait_s": pk_wait_s(load, bits, sizes),
        "queueing_mean_s": statistics.mean(beyond) if beyond else None,
        "buckets": bucket_table(rows, model),
        "background": {
            "kind": info["background"], "flows": len(bg),
            "fct_mean_s": statistics.mean((f["end_ns"] - f["start_ns"]) / 1e9 for _, f in bg)
            if bg else None,
            "jct_s": (max(f["end_ns"] for _, f in bg) - min(f["start_ns"] for _, f in bg))
            / 1e9 if bg else None},
    }


def expectations(ol: dict) -> list[Expectation]:
    """What was asked and what theory predicts, beside what the run produced."""
    if ol["kind"] == "rpc":
        return rpc_run.expectations(ol)
    out = []
    n = max(1, ol["flows_done"])
    if ol["arrival_rate_per_s"] is not None:
        out.append(Expectation(
            "open-loop flows' arrival rate", "lambda = rho B / E[S] per sender, summed",
            "Poisson arrivals (this run's [flows] table)", ol["arrival_rate_asked_per_s"],
            ol["arrival_rate_asked_per_s"], ol["arrival_rate_per_s"], "flows/s",
            tolerance=3 / math.sqrt(n),
            why_not="the agents started the flows late: see start_late_p99_s"))
    if ol["mean_size_bytes"] is not None:
        out.append(Expectation(
            "open-loop flows' mean size", "E[S] of the piecewise-linear CDF",
            ol["source"], ol["mean_size_asked_bytes"], ol["mean_size_asked_bytes"],
            ol["mean_size_bytes"], "B", tolerance=3 * ol["size_cv"] / math.sqrt(n),
            why_not="a heavy tail sampled by few flows"))
    if ol["slowdown_mean"] is not None:
        out.append(Expectation(
            "open-loop flows' mean slowdown", "M/G/1-PS: 1 / (1 - rho), every size",
            "Kleinrock, Queueing Systems vol. 2, 1976", ol["ps_slowdown"], ol["ps_slowdown"],
            ol["slowdown_mean"], "x",
            why_not="the fabric is not one fair queue: each receiver's link is a bottleneck "
            "too, and the agents' own time per flow weighs on the smallest flows"))
    if ol["queueing_mean_s"] is not None:
        ps_extra = ol["mean_size_asked_bytes"] / ol["rate_bytes_per_s"] * ol["load"] \
            / (1 - ol["load"])
        low, high = sorted((ps_extra, ol["pk_wait_s"]))
        out.append(Expectation(
            "open-loop flows' mean time beyond alone", "PS: E[T] rho / (1 - rho) ... FIFO: "
            "W = lambda E[T^2] / (2 (1 - rho)) (Pollaczek-Khinchine)",
            "Kleinrock, Queueing Systems, 1975-76", low, high, ol["queueing_mean_s"], "s",
            why_not="several bottlenecks in series and windowed senders: neither one FIFO "
            "nor one fair queue"))
    return out


def summary_lines(ol: dict | None) -> list[str]:
    """summary.md's "Open-loop flows" section."""
    if not ol:
        return []
    if ol.get("kind") == "rpc":
        return rpc_run.summary_lines(ol)

    def f(v, spec=".3g"):
        return "n/a" if v is None else format(v, spec)
    lines = ["", "## Open-loop flows", "",
             f"{ol['flows_done']} of {ol['flows_asked']} flows done from {ol['senders']} "
             f"senders at load {ol['load']:g} of their links, sizes `{ol['sizes']}` "
             f"({ol['source']}), destinations {ol['destinations']}. Arrival rate asked "
             f"{f(ol['arrival_rate_asked_per_s'])}/s, produced "
             f"{f(ol['arrival_rate_per_s'])}/s; mean size asked "
             f"{f(ol['mean_size_asked_bytes'], '.0f')} B, produced "
             f"{f(ol['mean_size_bytes'], '.0f')} B; load produced {f(ol['load_produced'])}; "
             f"flows started after their instant by {f(ol['start_late_p50_s'])} s at p50, "
             f"{f(ol['start_late_p99_s'])} s at p99.",
             "",
             "Slowdown = FCT / the flow's time alone (flows.csv: alone_s, slowdown). "
             f"Mean {f(ol['slowdown_mean'])}, p50 {f(ol['slowdown_p50'])}, p99 "
             f"{f(ol['slowdown_p99'])}; M/G/1 at this load: PS {f(ol['ps_slowdown'])} for "
             f"every size, FIFO's mean wait {f(ol['pk_wait_s'])} s (Pollaczek-Khinchine)."
             + (f" The agents' interrupt moderation may hold a packet up to "
                f"{f(ol['moderation_s'])} s at each end (coalesce_frames): a floor on the "
                "smallest flows' slowdown, which coalesce_frames = 0 lowers at a CPU cost "
                "(docs/flows.md)." if ol.get("moderation_s") is not None else ""),
             "", "| flow size | flows | slowdown p50 | p95 | p99 | FIFO model | PS model |",
             "|---|---|---|---|---|---|---|"]
    for b in ol["buckets"]:
        lines.append(f"| {b['low_bytes']:.0f}-{b['high_bytes']:.0f} B | {b['flows']} | "
                     f"{f(b['p50'])} | {f(b['p95'])} | {f(b['p99'])} | "
                     f"{f(b['fifo_model'])} | {f(b['ps_model'])} |")
    bg = ol["background"]
    if bg["kind"] != "none":
        lines += ["", f"Background job ({bg['kind']}, reported apart): {bg['flows']} flows, "
                  f"FCT mean {f(bg['fct_mean_s'])} s, done in {f(bg['jct_s'])} s."]
    return lines


def plot(folder, ol: dict):
    """plots/slowdown.png from flows.csv: every open-loop flow's slowdown against its
    size, each bucket's p50 and p99, and PS's 1 / (1 - rho) (an RPC run: its latency CDF,
    testbed.rpc_run)."""
    if ol["kind"] == "rpc":
        return rpc_run.plot(folder, ol)
    with open(folder / "flows.csv", newline="") as fh:
        pts = [(float(r["size_bytes"]), float(r["slowdown"])) for r in csv.DictReader(fh)
               if r.get("arrival_s") and r.get("slowdown")]
    if not pts:
        return None
    fig, ax = _figure(8, 4.5)
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.35, color="#7f8c8d",
               label="each flow")
    mids = [math.sqrt(max(1.0, b["low_bytes"]) * b["high_bytes"]) for b in ol["buckets"]]
    for key, colour in (("p50", "#1f618d"), ("p99", "#b03a2e")):
        xs = [m for m, b in zip(mids, ol["buckets"], strict=True) if b[key] is not None]
        ys = [b[key] for b in ol["buckets"] if b[key] is not None]
        ax.plot(xs, ys, marker="o", color=colour, label=f"slowdown {key} per size bucket")
    ax.axhline(ol["ps_slowdown"], color="#1e8449", linestyle="--",
               label=f"M/G/1-PS 1/(1-rho) = {ol['ps_slowdown']:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("flow size (bytes)")
    ax.set_ylabel("slowdown (FCT / time alone)")
    ax.set_title(f"Open-loop flows: {ol['sizes']} at load {ol['load']:g}")
    ax.legend(fontsize=7)
    return save_plot(fig, folder, "slowdown.png")


