"""What a results page draws, read from the results folder's own files (testbed.page
writes the page; `testbed report` rewrites it from the same files).

    config.toml              ─▶ the fabric: nodes where `testbed graph` puts them, one
                                directed link per port (a port sends on its link)
    pfc_timeline.csv         ─▶ per port and time: rate, queue, paused time, drops (the
      (else links.csv)          controller's samples where the run had one, else the
                                link sampler's)
    pfc.json                 ─▶ per port: CE marks, paused time, drops (run totals)
    flows.csv                ─▶ each flow's FCT, path and time split (testbed.attribution)
    metrics.json, summary.md ─▶ the headline, the fidelity verdict with its figures, the
                                expected-vs-measured table and the rest of the summary

Every series is on one clock, seconds since the workload started (testbed.plots says how
the files' clocks are moved onto it), cut to at most MAX_POINTS samples: a cumulative
counter keeps its value at each kept time, a queue the largest it reached in between.
"""

from __future__ import annotations

import csv
import json
import math
from bisect import bisect_right
from pathlib import Path

from testbed.draw import circular_positions, layered_positions, port_tip
from testbed.experiment import from_toml
from testbed.feature_plots import pfc_shift_s
from testbed.split_bars import SPLIT, bar_note, bar_parts
from topologies.spec import ENDPOINT_ROLES, Topology

MAX_POINTS = 200        # samples per series on a page
SLOWEST_FLOWS = 12      # flows listed with their time split
# what a link is coloured by: key -> (label, unit, a series over time or a run total only)
METRICS = {"util": ("utilization", "of the link's rate", True),
           "bytes": ("bytes sent", "bytes", True),
           "pause": ("time paused", "s", True),
           "drops": ("drops", "frames", True),
           "ce": ("CE marks", "frames (run total)", False)}


def topology(folder: Path) -> Topology:
    """The fabric the run built (config.toml holds the rate it ran at)."""
    return from_toml(folder / "config.toml").resolve_topology()


def fabric(topo: Topology) -> dict:
    """Nodes at the positions `testbed graph` draws them (in slot units, y up) and one
    directed link per port: {nodes, links}."""
    circular = not topo.switches()
    pos = circular_positions(topo) if circular else layered_positions(topo)[0]
    g = topo.graph
    nodes = [{"id": n, "role": d["role"], "x": round(pos[n][0], 4), "y": round(pos[n][1], 4),
              "endpoint": d["role"] in ENDPOINT_ROLES,
              "ports": [topo.ifname(n, p) for p in topo.ports(n)]}
             for n, d in g.nodes(data=True)]
    links = []
    for a in g.nodes:
        for b in topo.ports(a):
            e = g.edges[a, b]
            links.append({"id": f"{a}>{b}", "src": a, "dst": b, "ifname": topo.ifname(a, b),
                          "rate_mbps": e["rate_mbps"], "tech": e["tech"],
                          "tip": port_tip(topo, a, b)})
    return {"circular": circular, "nodes": nodes, "links": links}


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _grid(t_from: float, t_to: float, n: int) -> list[float]:
    step = (t_to - t_from) / (n - 1) if t_to > t_from and n > 1 else 0.0
    return [round(t_from + i * step, 6) for i in range(n)] if step else [t_from]


def _interpolate(times: list[float], values: list[float], t: float) -> float:
    """A cumulative counter at `t`, straight between the samples either side of it (its
    bytes spread evenly over the gap between two samples, not all at the later one)."""
    i = bisect_right(times, t)
    if i == 0:
        return values[0] if times and t >= times[0] else 0
    if i == len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (t - t0) / (t1 - t0)


def _resample(points: list[tuple[float, dict]], grid: list[float]) -> dict[str, list]:
    """One port's samples onto `grid`: bytes sent interpolated between samples, the other
    counters as they stood at each grid time (the last sample at or before it), the queue
    the largest it reached since the previous grid time."""
    times = [t for t, _ in points]
    sent = [v["sent"] for _, v in points]
    out: dict[str, list] = {k: [] for k in ("sent", "drops", "paused", "queue")}
    prev = 0
    for t in grid:
        i = bisect_right(times, t)
        last = points[i - 1][1] if i else None
        out["sent"].append(round(_interpolate(times, sent, t)))
        for k in ("drops", "paused"):
            out[k].append(last[k] if last else 0)
        window = [v["queue"] for _, v in points[prev:i]] or ([last["queue"]] if last else [0])
        out["queue"].append(max(window))
        prev = i
    return out


def _port_points(folder: Path, metrics: dict) -> tuple[dict, str]:
    """Per `node:ifname`, (time since the workload started, counters) in time order, and
    which file they came from."""
    points: dict[str, list] = {}
    pfc = folder / "pfc_timeline.csv"
    shift = pfc_shift_s(folder, metrics) if pfc.exists() else None
    if shift is not None:
        for r in _rows(pfc):
            points.setdefault(f"{r['node']}:{r['ifname']}", []).append(
                (float(r["t_s"]) + shift,
                 {"sent": int(r["sent_bytes"]), "drops": int(r["drops"]),
                  "paused": float(r["paused_s"]), "queue": int(r["backlog_bytes"])}))
        return points, "pfc_timeline.csv"
    window = metrics.get("workload_window_s") or [0.0, 0.0]
    for r in _rows(folder / "links.csv"):
        points.setdefault(f"{r['node']}:{r['ifname']}", []).append(
            (float(r["t_s"]) - window[0],
             {"sent": int(r["tx_bytes"]), "drops": int(r["drops"]), "paused": 0.0,
              "queue": int(r["backlog_bytes"])}))
    return points, "links.csv"


def _round(values: list[float], digits: int = 4) -> list[float]:
    return [float(f"{v:.{digits}g}") for v in values]


def series(folder: Path, metrics: dict, topo: Topology) -> dict:
    """{t: [...], source, ports: {ifname: {rate_mbps, util, bytes, queue, paused_s, drops}}}
    on one grid; a port that sent nothing, queued nothing and was never paused has none."""
    points, source = _port_points(folder, metrics)
    for pts in points.values():
        pts.sort(key=lambda p: p[0])
    times = [t for pts in points.values() for t, _ in pts]
    if not times:
        return {"t": [], "source": source, "ports": {}}
    # no finer than the samples: a grid between two samples would show a port's bytes
    # arriving in bursts at the sampler's beat
    grid = _grid(min(times), max(times), min(MAX_POINTS, max(len(p) for p in points.values())))
    ports = {}
    for key, pts in points.items():
        node, ifname = key.split(":", 1)
        s = _resample(pts, grid)
        if not any(s["sent"]) and not any(s["queue"]) and not any(s["paused"]):
            continue
        try:
            rate = topo.graph.edges[node, topo.peer(node, ifname)]["rate_mbps"]
        except (KeyError, IndexError, ValueError):
            continue      # a port the topology does not have: not drawn
        mbps = [0.0] + [max(0.0, (b - a) * 8e-6 / (t1 - t0)) if t1 > t0 else 0.0
                        for a, b, t0, t1 in zip(s["sent"], s["sent"][1:], grid, grid[1:],
                                                strict=False)]
        ports[ifname] = {"rate_mbps": _round(mbps), "util": _round([m / rate for m in mbps]),
                         "bytes": s["sent"], "queue": s["queue"],
                         "paused_s": _round(s["paused"]), "drops": s["drops"]}
    return {"t": _round(grid, 6), "source": source, "ports": ports}


def totals(folder: Path, metrics: dict, topo: Topology, ser: dict) -> dict[str, dict]:
    """Per ifname, the run's totals: {util (mean over the workload), bytes, pause, drops,
    ce, max_queue}."""
    try:
        pfc = json.loads((folder / "pfc.json").read_text())
    except (OSError, ValueError):
        pfc = {}
    ports = pfc.get("ports") or {}
    marks = (pfc.get("ecn") or {}).get("marks_by_port") or {}
    window = metrics.get("workload_window_s") or [0.0, 0.0]
    span = max(window[1] - window[0], 1e-9)
    samples = _last_link_samples(folder)
    out = {}
    for n in topo.graph.nodes:
        for p in topo.ports(n):
            ifname = topo.ifname(n, p)
            key, s, port = f"{n}:{ifname}", ser["ports"].get(ifname), ports.get(f"{n}:{ifname}")
            link = samples.get(ifname, {})
            sent = link.get("tx_bytes", s["bytes"][-1] if s else 0)
            rate = topo.graph.edges[n, p]["rate_mbps"]
            out[ifname] = {
                "util": round(min(sent * 8e-6 / span / rate, 9.99), 4),
                "bytes": sent,
                "pause": round((port or {}).get("paused_s", s["paused_s"][-1] if s else 0.0), 6),
                "drops": max(link.get("drops", 0), (port or {}).get("drops", 0)),
                "ce": int(marks.get(key, 0)),
                "max_queue": max([link.get("max_backlog", 0), (port or {}).get(
                    "max_backlog_bytes", 0)] + (s["queue"] if s else [0]))}
    return out


def _last_link_samples(folder: Path) -> dict[str, dict]:
    """links.csv's last sample per port (the run's totals) and its largest queue."""
    last: dict[str, dict] = {}
    for r in _rows(folder / "links.csv"):
        q = last.setdefault(r["ifname"], {"max_backlog": 0})
        q.update(tx_bytes=int(r["tx_bytes"]), drops=int(r["drops"]),
                 max_backlog=max(q["max_backlog"], int(r["backlog_bytes"])))
    return last


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def flows(folder: Path) -> dict:
    """{fct_s: every sending flow's FCT, sorted; slowest: the SLOWEST_FLOWS slowest with
    their path and time split; parts: the split's names}."""
    rows = [r for r in _rows(folder / "flows.csv") if r.get("role", "send") == "send"]
    done = [(r, _number(r.get("fct_s"))) for r in rows]
    done = [(r, f) for r, f in done if f is not None]
    done.sort(key=lambda rf: -rf[1])
    slowest = []
    for r, fct in done[:SLOWEST_FLOWS]:
        # the parts as the flow-time plot draws them: overlapping causes scaled to the FCT
        split, scale = bar_parts(r) if r.get("unexplained_s") else ({}, 1.0)
        slowest.append({
            "flow": f"{r['node']}:{r['tag']}#{r.get('iteration', 0)}", "src": r["src"],
            "dst": r["dst"], "size_bytes": int(float(r["size_bytes"] or 0)),
            "fct_s": fct, "goodput_mbps": _number(r.get("goodput_mbps")),
            "path": [p for p in (r.get("path") or "").split(">") if p],
            "bottleneck": r.get("bottleneck", ""),
            "split": {k: round(v, 6) for k, v in split.items()}, "split_scale": scale,
            "split_note": bar_note(r, scale).strip(" ()") if split else ""})
    return {"fct_s": sorted(round(f, 6) for _, f in done), "slowest": slowest,
            "parts": list(SPLIT)}


def headline(metrics: dict) -> dict:
    """The figures a page opens with."""
    keep = ("workload", "ranks", "transport", "entropy", "jct_mean_s", "ideal_s",
            "jct_over_ideal", "busbw_over_link", "link_mbps", "scale_factor", "ok",
            "errors", "engine")
    return {k: metrics.get(k) for k in keep}


def fidelity(metrics: dict) -> dict | None:
    """The verdict, its reasons, and each graded figure with its thresholds."""
    f = metrics.get("fidelity")
    if not f:
        return None
    figures, grades, bars = f.get("figures") or {}, f.get("grades") or {}, f.get("thresholds") or {}
    rows = [{"figure": k, "grade": g, "value": figures.get(k),
             "faithful": (bars.get(k) or {}).get("faithful"),
             "degraded": (bars.get(k) or {}).get("degraded"),
             "unit": (bars.get(k) or {}).get("unit", "")} for k, g in grades.items()]
    return {"verdict": f.get("verdict"), "reasons": f.get("reasons") or [], "rows": rows}


def run_model(folder: Path) -> dict:
    """Everything a run's page draws, from `folder`'s files."""
    metrics = json.loads((folder / "metrics.json").read_text())
    topo = topology(folder)
    ser = series(folder, metrics, topo)
    plots = sorted(p.relative_to(folder).as_posix() for p in (folder / "plots").glob("*.png"))
    plots += [p.name for p in sorted(folder.glob("*.png"))]
    pcaps = sorted(p.relative_to(folder).as_posix() for p in (folder / "pcaps").glob("*.pcap"))
    return {"name": folder.name, "topology": topo.name, "kind": topo.kind,
            "fabric": fabric(topo), "series": ser,
            "totals": totals(folder, metrics, topo, ser), "metrics": METRICS,
            "flows": flows(folder), "headline": headline(metrics),
            "fidelity": fidelity(metrics), "plots": plots, "pcaps": pcaps}
