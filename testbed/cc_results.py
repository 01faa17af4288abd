"""Congestion control in a results folder: what the agents measured of DCQCN or NSCC.

    agent-<node>.json "cc" ─▶ cc_metrics (metrics.json "cc") ─▶ summary_line (summary.md)
                                                             ─▶ plot (plots/dcqcn_rates.png)
                                                             ─▶ dcqcn_rates.csv

Every figure is counted by the agents on real packets: CE marks read from each data
packet's IP header (IP_RECVTOS), CNPs sent by the receivers (at most one per QP per
`cnp_interval`) and received by the senders, and each QP's rate after every change;
with NSCC (traffic.nscc) the marks the receivers echoed in ACKs, each sender's window
cuts, its lowest and final window, and its RTT samples, per sender>receiver pair.
"""

from __future__ import annotations

import csv
from pathlib import Path

from testbed.outputs import save_plot


def cc_metrics(agents: dict[str, dict], cnp_interval_ns: int | None) -> dict | None:
    """Totals, and per QP (sender>receiver): CE marks, CNPs, lowest and final rate."""
    parts = {node: a["cc"] for node, a in agents.items() if a.get("cc")}
    if not parts:
        return None
    if next(iter(parts.values()))["algorithm"] == "nscc":
        return nscc_metrics(parts)
    qps = {}
    for node, c in parts.items():
        for peer, q in c["qps"].items():
            qps[f"{node}>{peer}"] = {k: q[k] for k in ("cnps", "cuts", "increases",
                                                       "line_mbps", "lowest_mbps",
                                                       "final_mbps")}
    for node, c in parts.items():        # the receiver's side of each QP
        for src, sent in c["cnps_by_peer"].items():
            q = qps.setdefault(f"{src}>{node}", {})
            q["cnps_sent"] = sent
            q["ce_packets"] = c["ce_by_peer"].get(src, 0)
    return {"algorithm": next(iter(parts.values()))["algorithm"],
            "cnp_interval_ms": cnp_interval_ns / 1e6 if cnp_interval_ns else None,
            "ce_packets": sum(c["ce_packets"] for c in parts.values()),
            "cnps_sent": sum(c["cnps_sent"] for c in parts.values()),
            "cnps_received": sum(c["cnps_received"] for c in parts.values()),
            "cnps_unknown": sum(c["cnps_unknown"] for c in parts.values()),
            "lowest_rate_fraction": min((q["lowest_mbps"] / q["line_mbps"]
                                         for q in qps.values() if "line_mbps" in q),
                                        default=None),
            "qps": qps}


def nscc_metrics(parts: dict[str, dict]) -> dict:
    """Totals, and per pair (sender>receiver): marks echoed, cuts, windows, RTTs."""
    pairs = {f"{node}>{peer}": p for node, c in parts.items()
             for peer, p in sorted(c["peers"].items())}
    first = next(iter(parts.values()))
    p50s = [p["rtt_p50_us"] for p in pairs.values() if p["rtt_p50_us"] is not None]
    return {"algorithm": "nscc", "ecn": first["ecn"], "target_ms": first["target_us"] / 1e3,
            "ce_packets": sum(c["ce_packets"] for c in parts.values()),
            "ce_echoed": sum(p["ce_echoed"] for p in pairs.values()),
            "cuts": sum(p["cuts"] for p in pairs.values()),
            "loss_cuts": sum(p["loss_cuts"] for p in pairs.values()),
            "start_cwnd": max((p["start_cwnd"] for p in pairs.values()), default=None),
            "lowest_cwnd": min((p["lowest_cwnd"] for p in pairs.values()), default=None),
            "base_rtt_ms": min((p["base_rtt_us"] / 1e3 for p in pairs.values()
                                if p["base_rtt_us"] is not None), default=None),
            "rtt_p50_ms": sorted(p50s)[len(p50s) // 2] / 1e3 if p50s else None,
            "rtt_p99_ms": max((p["rtt_p99_us"] / 1e3 for p in pairs.values()
                               if p["rtt_p99_us"] is not None), default=None),
            "pairs": pairs}


def jain(values: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal."""
    sq = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * sq) if sq else 0.0


def port_queue(folder: Path, node: str, ifname: str, t_from: float,
               t_to: float) -> tuple[int, float]:
    """(largest over the run, average over [t_from, t_to]) backlog of one port's lossless
    queue, from the controller's timeline (pfc_timeline.csv: one sample every ~20 ms,
    seconds since pfc.json's t0_monotonic_s)."""
    with open(folder / "pfc_timeline.csv") as fh:
        pts = [(float(r["t_s"]), int(r["backlog_bytes"])) for r in csv.DictReader(fh)
               if r["node"] == node and r["ifname"] == ifname]
    inside = [b for t, b in pts if t_from <= t <= t_to] or [0]
    return max((b for _, b in pts), default=0), sum(inside) / len(inside)


def summary_line(cc: dict) -> str:
    if cc["algorithm"] == "nscc":
        low, start = cc.get("lowest_cwnd"), cc.get("start_cwnd")
        rtt = ("n/a" if cc.get("rtt_p50_ms") is None else
               f"{cc['base_rtt_ms']:.3g}/{cc['rtt_p50_ms']:.3g}/{cc['rtt_p99_ms']:.3g} ms")
        return (f"- congestion control nscc ({'CE marks and delay' if cc['ecn'] else 'delay'}"
                f", target {cc['target_ms']:g} ms): {cc['ce_packets']} CE-marked packets "
                f"arrived, {cc['ce_echoed']} echoed to the senders; {cc['cuts']} window "
                f"cuts, {cc['loss_cuts']} packets off on loss; lowest window "
                f"{'n/a' if low is None else f'{low:.3g}'} of {start} packets; RTT "
                f"base/p50 (median pair)/p99 {rtt}")
    low = cc.get("lowest_rate_fraction")
    return (f"- congestion control {cc['algorithm']}: {cc['ce_packets']} CE-marked packets "
            f"arrived, {cc['cnps_sent']} CNPs sent (at most one per QP per "
            f"{cc['cnp_interval_ms']:g} ms), {cc['cnps_received']} received; lowest QP rate "
            f"{'n/a' if low is None else f'{low:.1%}'} of line (dcqcn_rates.csv, "
            "plots/dcqcn_rates.png; CNPs in the pcaps: infiniband.bth.opcode == 129)")


def rate_rows(agents: dict[str, dict], t0_ns: int) -> list[tuple[str, float, float]]:
    """(qp, seconds since t0, Mbit/s) at every rate change of every QP."""
    rows = []
    for node, a in sorted(agents.items()):
        for peer, q in sorted(((a.get("cc") or {}).get("qps") or {}).items()):
            rows += [(f"{node}>{peer}", (t - t0_ns) / 1e9, r) for t, r in q["rate_mbps"]]
    return rows


def write_rates(folder: Path, agents: dict[str, dict], t0_ns: int) -> list[Path]:
    """dcqcn_rates.csv and plots/dcqcn_rates.png (nothing if no QP changed its rate)."""
    rows = rate_rows(agents, t0_ns)
    if not rows:
        return []
    with (folder / "dcqcn_rates.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["qp", "t_s", "rate_mbps"])
        w.writerows((q, f"{t:.6f}", r) for q, t, r in rows)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    qps = sorted({q for q, _, _ in rows})
    for qp in qps[:12]:
        pts = [(t, r) for q, t, r in rows if q == qp]
        ax.step([t for t, _ in pts], [r for _, r in pts], where="post", label=qp)
    ax.set_xlabel("time since the workload started (s)")
    ax.set_ylabel("DCQCN rate (Mbit/s, the sender's current rate)")
    ax.set_title("DCQCN: each QP's rate after every CNP and increase"
                 + (f" (12 of {len(qps)} QPs)" if len(qps) > 12 else ""))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    return [save_plot(fig, folder, "dcqcn_rates.png")]
