"""An incast's expected vs measured rows (testbed.expect): its JCT against the fluid bound,
and with PFC on, the lossless drops and the pause frames its receiver's switch sends.

The fluid bound is the run's own ideal (traffic.workloads.ideal_time_s): n senders of S
bytes each through the receiver's link of rate B take at least n S / B. htsim's figure
for the same 15:1 incast of 2 MB flows is printed beside it when the incast matches.

The pause rate of one ingress of the receiver's switch (`pause_rate_per_s`): PFC pauses
per ingress port, so in the fluid model each of the k ingress ports that carry the
incast gets an equal share r = B / k of the receiver's link (the port fairness of PFC:
a port with three senders behind it gets what a port with one gets). Its charged bytes
fall at r while its upstream is held, from XOFF + o (o: what arrived after the crossing,
at most its headroom) to XON, and rise at C - r once released (C: the ingress link's
rate; the upstream, held meanwhile, has a backlog) back to XOFF + o. One cycle takes
(dX + o) / r + (dX + o) / (C - r) with dX = XOFF - XON, so

    pauses per second = r (C - r) / (C (dX + o)) <= C / (4 dX)   (at r = C / 2, o = 0)

Each pause sends one XOFF frame, and one more every half pause quanta it lasts (the
controller's refresh). The run's own figures give every term but o, so the prediction
is the range o = headroom (fewest) to o = 0 (most).
"""

from __future__ import annotations

import math

from fabric.addressing import plan
from fabric.routing import compute_routes
from fabric.wire import MAX_QUANTA, quanta_s
from testbed.expect import Expectation
from topologies import units

# uet-htsim (github.com/ultraethernet/uet-htsim), its committed validate_outputs: a 15:1
# incast of 2 MB flows ends at 2,478.5 us against the 2,400 us the 30 MB take at line rate
HTSIM_SOURCE = "uet-htsim validate_outputs (15:1 incast of 2 MB flows: 2478.5 us / 2400 us)"
HTSIM_INCAST15_JCT_OVER_BOUND = 2478.5 / 2400
HTSIM_INCAST_SENDERS = 15
FLUID_SOURCE = "fluid model (testbed/incast_expect.py, docs/lossless.md)"
PAUSE_TOLERANCE = 0.25   # the on/off model ignores the FIFO's mix and the poll's grain


def receiver_switch(topo, receiver: str) -> str:
    """The switch on the receiver's NIC link (its first non-NVLink link)."""
    g = topo.graph
    links = [(d["rate_mbps"], p) for p, d in g.adj[receiver].items() if d["tech"] != "nvlink"]
    return min(links or [(d["rate_mbps"], p) for p, d in g.adj[receiver].items()])[1]


def incast_ingresses(topo, senders: list[str], receiver: str) -> list[str]:
    """The neighbours of the receiver's switch from which some sender's packets can
    arrive on their way to the receiver (every ECMP next hop followed)."""
    routes = compute_routes(topo)
    s = receiver_switch(topo, receiver)
    found: set[str] = set()
    seen: set[str] = set()
    todo = list(senders)
    while todo:
        node = todo.pop()
        if node in seen or node == receiver:
            continue
        seen.add(node)
        for nxt in routes[node].get(receiver, ()):
            if nxt == s:
                found.add(node)
            elif nxt != receiver:
                todo.append(nxt)
    return sorted(found)


def pause_rate_per_s(share_bps: float, line_bps: float, dx_bytes: int,
                     overshoot_bytes: float) -> float:
    """Pauses per second of one ingress in the fluid on/off model (module docstring);
    rates in bytes per second."""
    if share_bps <= 0 or line_bps <= share_bps:
        return 0.0      # never above XOFF, or never drained below XON while it sends
    return share_bps * (line_bps - share_bps) / (line_bps * (dx_bytes + overshoot_bytes))


def xoff_frames_per_pause(share_bps: float, dx_bytes: int, overshoot_bytes: float,
                          pause_s: float) -> int:
    """The XOFF frame that starts a pause and the refreshes while it lasts."""
    off_s = (dx_bytes + overshoot_bytes) / share_bps if share_bps > 0 else 0.0
    return 1 + math.floor(off_s / (pause_s / 2))


def expectations(topo, ranks: list[str], metrics: dict, pfc_report: dict | None
                 ) -> list[Expectation]:
    """The incast's rows (none for another workload or a run that did not complete)."""
    if metrics["workload"] != "incast" or not metrics.get("jct_mean_s"):
        return []
    n, jct, ideal = len(ranks) - 1, metrics["jct_mean_s"], metrics["ideal_s"]
    size, mbps = metrics["message_bytes"], metrics["link_mbps"]
    out = [Expectation("incast JCT", f"n S / B = {n} x {size} B / {mbps:g} Mbit/s",
                       "fluid bound (the run's ideal)", ideal, ideal, jct, "s",
                       why_not="headers, the switches' store-and-forward and recovery "
                               "cost time the bound leaves out")]
    if n == HTSIM_INCAST_SENDERS:
        out.append(Expectation("incast JCT / (n S / B)", "htsim, the same 15:1 incast",
                               HTSIM_SOURCE, HTSIM_INCAST15_JCT_OVER_BOUND,
                               HTSIM_INCAST15_JCT_OVER_BOUND, jct / ideal))
    if not pfc_report or not pfc_report.get("enabled"):
        return out
    out.append(Expectation("lossless drops", "0 (headroom holds what arrives while the "
                           "pause takes effect)", "IEEE 802.1Qbb", 0, 0,
                           pfc_report["totals"]["drops"],
                           why_not=f"the headroom's verdict: "
                                   f"{(pfc_report.get('headroom') or {}).get('verdict')}"))
    if incast_ingresses(topo, ranks[:-1], ranks[-1]):   # none: all over NVLink
        out.append(pause_expectation(topo, ranks, metrics, pfc_report))
    return out


def pause_expectation(topo, ranks: list[str], metrics: dict, rep: dict) -> Expectation:
    """XOFF frames per second at the receiver's switch's ingresses that carry the incast,
    the fluid model's range (module docstring) against the run's count over its JCT."""
    receiver, senders = ranks[-1], ranks[:-1]
    s = receiver_switch(topo, receiver)
    ups = incast_ingresses(topo, senders, receiver)
    k = len(ups)
    share = units.mbps_to_bytes_per_s(topo.graph.edges[receiver, s]["rate_mbps"]) / k
    quanta = rep["config"].get("tuning", {}).get("quanta", MAX_QUANTA)
    addresses = plan(topo)
    low = high = measured = 0.0
    for u in ups:
        key = f"{s}:{addresses.port(s, u).ifname}"
        th = rep["thresholds"][key]
        mbps = topo.graph.edges[s, u]["rate_mbps"]
        line, dx = units.mbps_to_bytes_per_s(mbps), th["xoff_bytes"] - th["xon_bytes"]
        pause = quanta_s(quanta, mbps)
        for o, bound in ((th["headroom_bytes"], "low"), (0, "high")):
            rate = (pause_rate_per_s(share, line, dx, o)
                    * xoff_frames_per_pause(share, dx, o, pause))
            if bound == "low":
                low += rate
            else:
                high += rate
        measured += rep["ports"].get(key, {}).get("xoff_frames", 0)
    busy_s = sum(it["jct_s"] for it in metrics["iterations"]) or metrics["jct_mean_s"]
    return Expectation(
        f"XOFF frames/s, {s}'s {k} incast ingresses (within {PAUSE_TOLERANCE:.0%})",
        "sum over k: r(C-r)/(C(XOFF-XON+o)), r = B/k, o in [0, headroom]; "
        "each <= C/(4(XOFF-XON))", FLUID_SOURCE, low, high, measured / busy_s, "/s",
        tolerance=PAUSE_TOLERANCE,
        why_not="a port's share is the FIFO's mix, not B/k, and pauses start only at "
                "the controller's polls")
