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

from topologies.stats import percentile

HELD_TOLERANCE = 0.05     # within 5 % of 1 / share, DCQCN's rates explain the JCT


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
            "held": dcqcn_held(agents),
            "cnp_interval_ms": cnp_interval_ns / 1e6 if cnp_interval_ns else None,
            "ce_packets": sum(c["ce_packets"] for c in parts.values()),
            "cnps_sent": sum(c["cnps_sent"] for c in parts.values()),
            "cnps_received": sum(c["cnps_received"] for c in parts.values()),
            "cnps_unknown": sum(c["cnps_unknown"] for c in parts.values()),
            "lowest_rate_fraction": min((q["lowest_mbps"] / q["line_mbps"]
                                         for q in qps.values() if "line_mbps" in q),
                                        default=None),
            "qps": qps}


def qp_steps(rates: list[list], line_mbps: float, start_ns: int,
             end_ns: int) -> list[tuple[int, float]]:
    """One QP's rate over [start_ns, end_ns) as steps (t_ns, Mbit/s): the line rate until
    its first change, then each change DCQCN logged (`rates`: [t_ns, Mbit/s])."""
    now = line_mbps
    for t, r in rates:
        if t <= start_ns:
            now = r
    return [(start_ns, now)] + [(t, r) for t, r in rates if start_ns < t < end_ns]


def used_share(spans: dict[str, tuple[int, int]], qps: dict[str, dict],
               link_mbps: float) -> float:
    """The mean, from the first start to the last end, of min(1, the active QPs' rates /
    the link rate); `spans` maps each sender to the (first start, last end) of its flows,
    `qps` each sender to its QP's record (line_mbps, rate_mbps)."""
    events: list[tuple[int, float]] = []                  # (t_ns, change of the sum)
    for src, (start, end) in spans.items():
        steps = qp_steps(qps[src]["rate_mbps"], qps[src]["line_mbps"], start, end)
        prev = 0.0
        for t, r in steps:
            events.append((t, r - prev))
            prev = r
        events.append((end, -prev))
    events.sort()
    t0 = min(s for s, _ in spans.values())
    t1 = max(e for _, e in spans.values())
    total = area = 0.0
    last = t0
    for t, change in events:
        area += min(1.0, total / link_mbps) * (t - last)
        total, last = total + change, t
    return area / (t1 - t0) if t1 > t0 else 1.0


def dcqcn_held(agents: dict[str, dict]) -> dict | None:
    """How much of each receiver's link DCQCN let its senders use while their flows ran:
    at every instant min(1, the sum of the active QPs' rates / the link rate), averaged
    over each iteration's span of that receiver's flows (first start to last end), then
    over the iterations. A share f alone predicts a JCT of 1/f the ideal; what is left
    beyond it was not DCQCN's doing. The receiver with the least is reported (in an
    incast, the incast's); None where no QP changed its rate."""
    qps = {(node, peer): q for node, a in agents.items()
           for peer, q in ((a.get("cc") or {}).get("qps") or {}).items()}
    if not any(q["rate_mbps"] for q in qps.values()):
        return None
    spans: dict[str, dict[int, dict[str, tuple[int, int]]]] = {}
    for node, a in agents.items():
        for f in a["flows"]:
            if f.get("role") != "send" or not f.get("start_ns") or not f.get("end_ns") \
                    or (node, f["dst"]) not in qps:             # 0: it never started/ended
                continue
            by_src = spans.setdefault(f["dst"], {}).setdefault(f.get("iteration", 0), {})
            start, end = by_src.get(node, (f["start_ns"], f["end_ns"]))
            by_src[node] = (min(start, f["start_ns"]), max(end, f["end_ns"]))
    worst = None
    for dst, iterations in spans.items():
        senders = {src for it in iterations.values() for src in it}
        mine = {src: qps[(src, dst)] for src in senders}
        link = max(q["line_mbps"] for q in mine.values())
        shares = [used_share(it, mine, link) for it in iterations.values()]
        share = sum(shares) / len(shares)
        if worst is None or share < worst["allowed_fraction"]:
            worst = {"receiver": dst, "allowed_fraction": round(share, 4),
                     "senders": len(senders), "link_mbps": link}
    return worst


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
            "rtt_p50_ms": percentile(p50s, 50) / 1e3 if p50s else None,
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


def held_line(held: dict | None, jct_over_ideal: float | None) -> str:
    """What DCQCN's own rates predict of the JCT, beside the measured."""
    if not held:
        return ""
    share = held["allowed_fraction"]
    predicted = 1 / share if share > 0 else None
    line = (f"\n  - DCQCN let the senders of {held['receiver']} ({held['senders']}) use "
            f"{share:.1%} of its {held['link_mbps']:g} Mbit/s link on average while their "
            "flows ran (the sum of their rates, capped at the link)")
    if predicted and jct_over_ideal:
        rest = jct_over_ideal / predicted - 1
        verdict = ("DCQCN's rates explain it" if abs(rest) <= HELD_TOLERANCE
                   else f"{rest:+.1%} of it is not DCQCN's doing")
        line += (f": that alone predicts JCT/ideal {predicted:.3g} (1 / share); measured "
                 f"{jct_over_ideal:.3g}: {verdict}")
    return line


def summary_line(cc: dict, jct_over_ideal: float | None = None) -> str:
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
            "plots/dcqcn_rates.png; CNPs in the pcaps: infiniband.bth.opcode == 129)"
            + held_line(cc.get("held"), jct_over_ideal))


def rate_rows(agents: dict[str, dict], t0_ns: int) -> list[tuple[str, float, float]]:
    """(qp, seconds since t0, Mbit/s) at every rate change of every QP."""
    rows = []
    for node, a in sorted(agents.items()):
        for peer, q in sorted(((a.get("cc") or {}).get("qps") or {}).items()):
            rows += [(f"{node}>{peer}", (t - t0_ns) / 1e9, r) for t, r in q["rate_mbps"]]
    return rows


def write_rates(folder: Path, agents: dict[str, dict], t0_ns: int) -> Path | None:
    """dcqcn_rates.csv (testbed.plots draws it; nothing if no QP changed its rate)."""
    rows = rate_rows(agents, t0_ns)
    if not rows:
        return None
    path = folder / "dcqcn_rates.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["qp", "t_s", "rate_mbps"])
        w.writerows((q, f"{t:.6f}", r) for q, t, r in rows)
    return path
