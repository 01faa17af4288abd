"""Request/response in a run (workload rpc): the schedule, and the RPCs' latency and
throughput against what the fabric allows.

    [rpc] table ─▶ schedule (traffic.rpc) ─▶ agents ─▶ results: metrics.json "open_loop"
      (kind rpc): latency p50/p99/p99.9 (the client's view: its request's first packet
      to its response's last), RPCs per second, and summary.md's section, plots/
      rpc_latency.png (the latency CDF)

Expected: on an idle fabric an RPC takes its request's and its response's times alone
(testbed.attribution's alone_s, summed); a closed loop keeps Little's law, N = X R (N
requests in flight, X per second, R the mean latency: an identity of any closed system,
so a mismatch is the agents' own time between a response and the next request); and
no more responses per second than the servers' links carry, sum B / E[response].
"""

from __future__ import annotations

import statistics

from testbed import attribution
from testbed.expect import Expectation
from testbed.feature_plots import _figure
from testbed.outputs import save_plot
from topologies import units
from topologies.stats import percentile


def rpc_rows(info: dict, agents: dict[str, dict], split: dict[str, dict]) -> list[dict]:
    """Every answered RPC: its latency, its request's and response's times alone."""
    sent: dict[tuple[str, int], dict] = {}        # (tag, iteration) -> the send flow
    got: dict[tuple[str, str, int], dict] = {}    # (node, tag, iteration) -> a recv flow
    for node, a in agents.items():
        for f in a["flows"]:
            if f["role"] == "send":
                sent[f["tag"], f["iteration"]] = {
                    **f, **split.get(attribution.flow_id(node, f), {})}
            else:
                got[node, f["tag"], f["iteration"]] = f
    rows = []
    iterations = sorted({it for _, it in sent})
    for r in info["rpcs"]:
        for it in iterations:
            req = sent.get((f"{r.tag}.req", it))
            if req is None:
                continue
            resp = sent.get((f"{r.tag}.resp", it))
            back = got.get((r.client, f"{r.tag}.resp", it))   # on the client's own clock
            if not back or back.get("end_ns") is None or req.get("start_ns") is None:
                continue
            alone = (req.get("alone_s") or 0.0) + ((resp or {}).get("alone_s") or 0.0)
            rows.append({"tag": r.tag, "iteration": it, "client": r.client,
                         "server": r.server, "response_bytes": r.response_bytes,
                         "latency_s": (back["end_ns"] - req["start_ns"]) / 1e9,
                         "alone_s": alone or None, "start_ns": req["start_ns"],
                         "end_ns": back["end_ns"]})
    return rows


def results(info: dict, agents: dict[str, dict], split: dict[str, dict]) -> dict:
    rows = rpc_rows(info, agents, split)
    lat = [r["latency_s"] for r in rows]
    alone = [r["alone_s"] for r in rows if r["alone_s"]]
    span = ((max(r["end_ns"] for r in rows) - min(r["start_ns"] for r in rows)) / 1e9
            if rows else 0.0)
    server_bytes_s = sum(units.mbps_to_bytes_per_s(info["server_mbps"][s])
                         for s in info["servers"])
    return {
        "kind": "rpc", "clients": len(info["clients"]), "servers": len(info["servers"]),
        "closed_loop": info["closed"], "concurrency": info["concurrency"],
        "rate_per_s": info["rate_per_s"], "response": info["response"],
        "rpcs_asked": len(info["rpcs"]), "rpcs_done": len(rows),
        "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
        "latency_p999_s": percentile(lat, 99.9),
        "latency_mean_s": statistics.mean(lat) if lat else None,
        "alone_mean_s": statistics.mean(alone) if alone else None,
        "rpcs_per_s": len(rows) / span if span else None,
        "servers_bound_per_s": server_bytes_s / info["mean_response_bytes"],
        "latency_cdf_s": sorted(round(x, 6) for x in lat)}


def expectations(ol: dict) -> list[Expectation]:
    out = []
    if ol["latency_p50_s"] is not None and ol["alone_mean_s"]:
        out.append(Expectation(
            "RPC latency p50, at least", "request alone + response alone (each: frames at "
            "the slowest link + a frame per hop)", "store-and-forward on an idle fabric",
            ol["alone_mean_s"], ol["latency_p50_s"] * 10, ol["latency_p50_s"], "s",
            tolerance=0.05, why_not="an idle port's token bucket lets one burst (1 ms of "
            "its rate, at least two frames) through at once: a message smaller than that "
            "beats its serialization"))
    if ol["closed_loop"] and ol["rpcs_per_s"] and ol["latency_mean_s"]:
        n = ol["clients"] * ol["concurrency"]
        out.append(Expectation(
            "RPCs in flight (closed loop)", "Little's law N = X R", "Little, Operations "
            "Research 1961", n, n, ol["rpcs_per_s"] * ol["latency_mean_s"], "",
            why_not="the agents' own time between a response and the next request"))
    if ol["rpcs_per_s"]:
        out.append(Expectation(
            "RPCs per second, at most", "sum of the servers' links (all of each) / E[response]",
            "the servers' links carry every response", 0.0, ol["servers_bound_per_s"],
            ol["rpcs_per_s"], "/s", why_not="more responses than the servers' links carry"))
    return out


def summary_lines(ol: dict) -> list[str]:
    def f(v, spec=".3g"):
        return "n/a" if v is None else format(v, spec)
    mode = (f"closed loop, {ol['concurrency']} in flight per client" if ol["closed_loop"]
            else f"open loop, {ol['rate_per_s']:g} requests/s per client")
    return ["", "## Request/response", "",
            f"{ol['rpcs_done']} of {ol['rpcs_asked']} RPCs answered: {ol['clients']} clients, "
            f"{ol['servers']} servers, {mode}, responses {ol['response']}.", "",
            "| latency p50 | p99 | p99.9 | mean | alone (mean) | RPCs/s | servers' bound |",
            "|---|---|---|---|---|---|---|",
            f"| {f(ol['latency_p50_s'])} s | {f(ol['latency_p99_s'])} s | "
            f"{f(ol['latency_p999_s'])} s | {f(ol['latency_mean_s'])} s | "
            f"{f(ol['alone_mean_s'])} s | {f(ol['rpcs_per_s'])} | "
            f"{f(ol['servers_bound_per_s'])} |"]


def plot(folder, ol: dict):
    """plots/rpc_latency.png: the RPC latency CDF, the p50/p99/p99.9 marked."""
    lat = ol.get("latency_cdf_s") or []
    if not lat:
        return None
    fig, ax = _figure(7, 4)
    ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], color="#1f618d")
    for key, label in (("latency_p50_s", "p50"), ("latency_p99_s", "p99"),
                       ("latency_p999_s", "p99.9")):
        if ol.get(key):
            ax.axvline(ol[key], color="#b03a2e", linestyle=":", linewidth=1)
            ax.text(ol[key], 0.02, f" {label}", fontsize=7, color="#b03a2e")
    if ol.get("alone_mean_s"):
        ax.axvline(ol["alone_mean_s"], color="#1e8449", linestyle="--",
                   label="request + response alone")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("RPC latency (s, emulated)")
    ax.set_ylabel("fraction of RPCs")
    ax.set_title(f"Request/response: {ol['clients']} clients, {ol['servers']} servers")
    return save_plot(fig, folder, "rpc_latency.png")

