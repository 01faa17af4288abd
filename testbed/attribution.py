"""Why each flow took the time it did: its completion time split into causes.

    fct = serialization (its bytes at its max-min fair share of the links it crossed)
        + store-and-forward (one frame at its slowest link per node that forwards it)
        + paused (the time its bottleneck link lost while PFC held it with frames waiting
          in its queue (lost_fractions, from the PFC controller's samples); every flow
          through that link loses it. Pauses before the bottleneck
          are how a lossless fabric holds a sender to its share, which serialization
          already counts)
        + acks (when its window ran out while its ACKs took the way back: the same bytes
          at window / (its least one-way delay + the way back), and the last window's
          way back, less the serialization, when that rate is below its share; the way
          back is its mean round trip, timed by the sender, less its packets' mean
          one-way delay, stamped by the receiver)
        + recovery (the wire time, at its share, of the copies the receiver got and
          threw away (go-back-N's resends of frames that were not lost, duplicates),
          and the retransmission timeouts waited out)
        + cc (DCQCN held its QP below its fair share)
        + starved (the agent left its ports idle with frames it could send: the emulator)
        + unexplained (what is left; negative only when serialization and
          store-and-forward alone exceed the FCT: it went faster than its share)

Causes overlap on a flow's own timeline (an RTO wait runs while its last window is
still on the wire, a pause may fall inside a recovery), so each is charged only the
time the causes before it in ORDER left unexplained: serialization and store-and-forward
in full, then paused, starved, recovery's wire time, recovery's timeout waits, cc and
acks, each at most what is left of the FCT. `overlap_s` is what the causes would have
added beyond that: time two of them explain, counted once.

The fair share is max-min (Bertsekas & Gallager, Data Networks, 6.5.2), computed by
progressive filling over every directed link, host ports and downlinks included, among
the flows measured to be running at each instant: it changes whenever a flow starts or
ends, and a flow's serialization is its wire bytes at its mean share over its life. A
flow's path is the kernel's own answer for its source port (fabric.paths); a flow
whose port varies (spray, flowlets) is spread evenly over its ports and over every
equal-cost next hop, as a uniform hash spreads it. A flow's clock starts when its data
is ready (its step's dependencies are done), so a collective's waits lie between its
flows, not inside them: `waits` gives each flow the wait before it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from fabric.routing import compute_routes
from testbed.link_check import Link, flow_id, frame_bytes, path_check
from traffic.agent_config import FRAME_OVERHEAD_BYTES

PARTS = ("serialization_s", "hops_s", "paused_s", "acks_s", "recovery_s", "cc_s",
         "starved_s")
COLUMNS = ("path", "fair_mbps", "bottleneck", *PARTS, "unexplained_s", "overlap_s",
           "waited_s", "alone_s", "slowdown")
# the order in which overlapping causes are charged (each at most what is left); the
# parts before CAPPED_FROM are physics (its bytes at its share, one frame per hop) and
# are charged in full
ORDER = ("serialization_s", "hops_s", "paused_s", "starved_s", "resent_s", "rto_s", "cc_s",
         "acks_s")
CAPPED_FROM = 2
MAX_FLOWS = 4000          # progressive filling at every start and end: O(events x flows)
EPS = 1e-9


def link_capacity(topo) -> dict[Link, float]:
    """Each directed link's Mbit/s (both directions of an edge run at its rate)."""
    capacity = {}
    for a, b, d in topo.graph.edges(data=True):
        capacity[(a, b)] = capacity[(b, a)] = d["rate_mbps"]
    return capacity


def path_weights(path: list[str]) -> dict[Link, float]:
    return {(a, b): 1.0 for a, b in zip(path, path[1:], strict=False)}


def path_text(src: str, dst: str, weights: dict[Link, float]) -> str:
    """"a>b>c" for a single path; "spread" for a flow spread over several."""
    if any(w < 1.0 for w in weights.values()):
        return "spread"
    nxt = dict(weights)
    hops = [src]
    while hops[-1] != dst and len(hops) <= len(nxt):
        hops.append(next(b for a, b in nxt if a == hops[-1]))
    return ">".join(hops)


def weights_of(path: str, routes, src: str, dst: str, first_hops: list[str]):
    """A flow's links back from its flows.csv path ("spread": over `routes`)."""
    if path == "spread":
        return spread_weights(routes, src, dst, first_hops)
    return path_weights(path.split(">"))


def spread_weights(routes, src: str, dst: str, first_hops: list[str]) -> dict[Link, float]:
    """The share of a flow's bytes on each link when it is split evenly over its first
    hops and, at every node after, over every next hop `routes` gives toward dst."""
    dist: dict[str, int] = {dst: 0}

    def distance(node: str) -> int:
        if node not in dist:
            dist[node] = 1 + distance(routes[node][dst][0])
        return dist[node]

    weights: dict[Link, float] = defaultdict(float)
    mass: dict[str, float] = defaultdict(float)
    for hop in first_hops:
        weights[(src, hop)] += 1 / len(first_hops)
        mass[hop] += 1 / len(first_hops)
    while set(mass) - {dst}:
        node = max((n for n in mass if n != dst), key=distance)
        share = mass.pop(node)
        hops = routes[node][dst]
        for hop in hops:
            weights[(node, hop)] += share / len(hops)
            mass[hop] += share / len(hops)
    return dict(weights)


def max_min(active: list[str], weights: dict[str, dict[Link, float]],
            capacity: dict[Link, float]) -> tuple[dict[str, float], dict[str, Link]]:
    """Max-min fair rates of the `active` flows (each link's load is the sum of its
    flows' rates times their weight on it) and the link that froze each flow."""
    rate = {f: 0.0 for f in active}
    bottleneck: dict[str, Link] = {}
    load: dict[Link, float] = defaultdict(float)
    users: dict[Link, list[str]] = defaultdict(list)
    for f in active:
        for link in weights[f]:
            users[link].append(f)
    free = set(active)
    while free:
        step, tight = None, []
        for link, fs in users.items():
            w = sum(weights[f][link] for f in fs if f in free)
            if w <= EPS:
                continue
            room = (capacity[link] - load[link]) / w
            if step is None or room < step - EPS:
                step, tight = room, [link]
            elif abs(room - step) <= EPS:
                tight.append(link)
        if step is None:
            break
        step = max(step, 0.0)
        for f in free:
            rate[f] += step
            for link, w in weights[f].items():
                load[link] += step * w
        for link in tight:
            for f in users[link]:
                if f in free:
                    free.discard(f)
                    bottleneck[f] = link
    return rate, bottleneck


def fair_shares(flows: dict[str, tuple[int, int]], weights: dict[str, dict[Link, float]],
                capacity: dict[Link, float]):
    """Each flow's max-min rate over its life, as steps {flow: [(t0, t1, Mbit/s,
    bottleneck link)]}: the active set is taken from the measured (start, end) of
    `flows`."""
    times = sorted({t for span in flows.values() for t in span})
    steps: dict[str, list] = defaultdict(list)
    for t0, t1 in zip(times, times[1:], strict=False):
        active = [f for f, (s, e) in flows.items() if s <= t0 and e >= t1]
        if not active:
            continue
        rate, neck = max_min(active, weights, capacity)
        for f in active:
            steps[f].append((t0, t1, rate[f], neck.get(f)))
    return steps


def lost_s(spans: list[tuple[int, int, float]], t0: int, t1: int) -> float:
    """Seconds of [t0, t1] (ns) the link's capacity was lost (lost_fractions' spans)."""
    k = max(0, bisect_right(spans, (t0, float("inf"), 0.0)) - 1)
    total = 0.0
    for a, b, fraction in spans[k:]:
        if a >= t1:
            break
        inside = min(b, t1) - max(a, t0)
        if inside > 0:
            total += fraction * inside / 1e9
    return total


def fluid_completion(sizes_bits: dict[str, float], weights: dict[str, dict[Link, float]],
                     capacity: dict[Link, float]) -> dict[str, float]:
    """When each flow would end if all started at once and shared every link max-min
    fairly all along (the collision model: no queues, no pauses, no losses), seconds."""
    left = dict(sizes_bits)
    done: dict[str, float] = {}
    now = 0.0
    while left:
        rate, _ = max_min(list(left), weights, capacity)
        step = min(bits / (rate[f] * 1e6) for f, bits in left.items() if rate[f] > 0)
        now += step
        for f in list(left):
            left[f] -= rate[f] * 1e6 * step
            if left[f] <= 1e-6 * sizes_bits[f]:
                done[f] = now
                del left[f]
    return done


def collision_model_s(sends: list[dict], topo) -> float:
    """The collision model's JCT for a run's send flows (flows.csv rows, one iteration):
    their bytes and frame overheads shared max-min on their kernel paths, all starting
    together (fluid_completion), seconds."""
    routes = compute_routes(topo)
    weights = {r["tag"]: weights_of(r["path"], routes, r["node"], r["dst"],
                                    topo.ports(r["node"])) for r in sends}
    bits = {r["tag"]: 8 * (int(r["size_bytes"]) + (int(r["packets"]) - int(r["retransmits"]))
                            * FRAME_OVERHEAD_BYTES)
            for r in sends}
    return max(fluid_completion(bits, weights, link_capacity(topo)).values())


def lost_fractions(samples: dict[Link, list[tuple[float, int, int, float]]],
                   capacity: dict[Link, float]) -> dict[Link, list[tuple[int, int, float]]]:
    """Per link, the share of its capacity PFC took in each interval between the PFC
    controller's samples ([(t0_ns, t1_ns, fraction)]), from each sample's (t_s, lossless
    backlog bytes, lossless bytes sent so far, seconds the port was held by a pause so
    far): over an interval in which the port was held and its queue held frames at both
    samples, the share of it the port did not spend sending, at most the share it was
    held (an interval where the queue filled or ran dry is not judged: it may have sent
    at line rate all the time it held frames). A port held with frames waiting loses
    that time; one that makes up for a pause with a burst after it loses nothing; a port
    that sent below its line rate with no pause lost nothing to PFC (that is the
    emulator's, or the samples' jitter). The fraction may be negative (a burst above
    the line rate): kept, so that the samples' jitter evens out over a flow's life
    instead of adding up. Times are on the agents' clock."""
    out = {}
    for link, series in samples.items():
        if link not in capacity:
            continue
        line_bps = capacity[link] * 1e6
        spans = []
        for (t0, q0, b0, p0), (t1, q1, b1, p1) in zip(series, series[1:], strict=False):
            if t1 > t0 and q0 > 0 and q1 > 0 and p1 > p0:
                spans.append((int(t0 * 1e9), int(t1 * 1e9),
                              min(1 - (b1 - b0) * 8 / (line_bps * (t1 - t0)),
                                  (p1 - p0) / (t1 - t0), 1.0)))
        if spans:
            out[link] = spans
    return out


def cc_lost_s(steps: list, rates: list[list], line_mbps: float) -> float:
    """Time lost to DCQCN: over each step of the fair share (t0, t1, fair Mbit/s),
    the fraction by which the QP's rate (`rates`: [t_ns, Mbit/s] after each change, the
    line rate before the first) stayed below it."""
    times = [t for t, _ in rates]
    lost = 0.0
    for t0, t1, fair, _ in steps:
        cuts = [t0] + [t for t in times if t0 < t < t1] + [t1]
        for a, b in zip(cuts, cuts[1:], strict=False):
            k = bisect_right(times, a) - 1
            rc = rates[k][1] if k >= 0 else line_mbps
            if fair > 0 and rc < fair:
                lost += (b - a) / 1e9 * (1 - rc / fair)
    return lost


def waits(agents: dict[str, dict]) -> dict[str, float]:
    """Before each send flow, how long its sender had nothing to send (seconds): from
    the later of its iteration's start and the end of the sender's last flow before it,
    to its own start. In a collective that is the wait for its inputs (the previous
    step's data); it is not part of the flow's own time."""
    out = {}
    for node, a in agents.items():
        starts = {k: it["start_ns"] for k, it in enumerate(a.get("iterations", []))}
        sends = sorted((f for f in a["flows"] if f["role"] == "send"
                        and f.get("start_ns") is not None and f.get("end_ns") is not None),
                       key=lambda f: f["start_ns"])
        for f in sends:
            ready = max([starts.get(f["iteration"], f["start_ns"])]
                        + [g["end_ns"] for g in sends if g["end_ns"] <= f["start_ns"]])
            out[flow_id(node, f)] = max(0, f["start_ns"] - ready) / 1e9
    return out


def attribute(agents: dict[str, dict], weights: dict[str, dict[Link, float]],
              capacity: dict[Link, float], lost=None) -> dict[str, dict]:
    """Every finished send flow's split (COLUMNS), keyed by flow_id. `weights` holds the
    links of each flow (path_weights or spread_weights), `capacity` each directed link's
    Mbit/s, `lost` the capacity PFC's pauses took from each (lost_fractions) or None."""
    sends = {flow_id(node, f): (node, f) for node, a in agents.items() for f in a["flows"]
             if f["role"] == "send" and f.get("start_ns") is not None
             and f.get("end_ns") is not None
             and flow_id(node, f) in weights}
    spans = {fid: (f["start_ns"], f["end_ns"]) for fid, (_, f) in sends.items()}
    steps = fair_shares(spans, weights, capacity)
    lost = lost or {}
    one_way: dict[tuple[str, int], list[int]] = defaultdict(list)
    for a in agents.values():
        for tag, it, ns in a.get("latency_ns", []):
            one_way[(tag, it)].append(ns)
    waited = waits(agents)
    received_by = received(agents)
    out = {}
    for fid, (node, f) in sends.items():
        life = f["end_ns"] - f["start_ns"]
        mine = steps.get(fid, [])
        fair = sum(r * (t1 - t0) for t0, t1, r, _ in mine) / life if life else 0.0
        held = sum(lost_s(lost[link], t0, t1) for t0, t1, _, link in mine if link in lost)
        neck_time: dict[Link, int] = defaultdict(int)
        for t0, t1, _, link in mine:
            if link is not None:
                neck_time[link] += t1 - t0
        neck = max(neck_time, key=neck_time.get) if neck_time else None
        frame = frame_bytes(f)
        wire_bits = 8 * f["npackets"] * frame
        bps = fair * 1e6
        serialization = wire_bits / bps if bps else 0.0
        hops = len({a for a, _ in weights[fid]} - {node})        # nodes that forward it
        slowest = min(capacity[link] for link in weights[fid]) * 1e6
        qp = ((agents[node].get("cc") or {}).get("qps") or {}).get(f["dst"])
        fwd = one_way.get((f["tag"], f["iteration"]))
        acks = 0.0
        if fwd and f.get("rtt_mean_ns") and f.get("window_packets"):
            back = max(0.0, f["rtt_mean_ns"] - sum(fwd) / len(fwd))
            window_bps = f["window_packets"] * frame * 8 / ((min(fwd) + back) / 1e9)
            if window_bps < bps:             # ACK-clocked: each window waits a way back,
                acks = back / 1e9 + wire_bits / window_bps - serialization   # the last too
        causes = {
            "serialization_s": serialization,
            "hops_s": hops * 8 * frame / slowest,
            "paused_s": max(0.0, held),
            "starved_s": (f.get("starved_ns") or 0) / 1e9,
            "resent_s": wasted_frames(f, received_by.get(fid)) * 8 * frame / bps if bps else 0.0,
            "rto_s": (f.get("rto_wait_ns") or 0) / 1e9,
            "cc_s": cc_lost_s(mine, qp["rate_mbps"], qp["line_mbps"])
            if qp and qp.get("rate_mbps") else 0.0,
            "acks_s": acks,
        }
        charged = charge(causes, life / 1e9)
        row = {
            "path": path_text(node, f["dst"], weights[fid]),
            "fair_mbps": fair,
            "bottleneck": f"{neck[0]}>{neck[1]}" if neck else "",
            **{p: charged[p] for p in PARTS if p != "recovery_s"},
            "recovery_s": charged["resent_s"] + charged["rto_s"],
        }
        row["unexplained_s"] = life / 1e9 - sum(row[p] for p in PARTS)
        row["overlap_s"] = sum(causes.values()) - sum(charged.values())
        row["waited_s"] = waited.get(fid, 0.0)
        # alone on an empty fabric: its frames at its path's slowest link, one frame's
        # store-and-forward per hop; the FCT over that is its slowdown
        row["alone_s"] = (wire_bits + hops * 8 * frame) / slowest
        row["slowdown"] = life / 1e9 / row["alone_s"] if row["alone_s"] else None
        out[fid] = row
    return out


def charge(causes: dict[str, float], fct_s: float) -> dict[str, float]:
    """Each cause's time on the flow's own timeline: in ORDER, the physics in full, then
    each other cause at most what the causes before it left of `fct_s` (so causes that
    overlapped are counted once, by the first in ORDER)."""
    out, used = {}, 0.0
    for k, name in enumerate(ORDER):
        value = max(0.0, causes[name])
        out[name] = value if k < CAPPED_FROM else min(value, max(0.0, fct_s - used))
        used += out[name]
    return out


def received(agents: dict[str, dict]) -> dict[str, dict]:
    """Each send flow's receive record at its destination, keyed by the send's flow_id."""
    out = {}
    for a in agents.values():
        for f in a["flows"]:
            if f["role"] == "recv" and f.get("src") in agents:
                out[flow_id(f["src"], f)] = f
    return out


def wasted_frames(send: dict, recv: dict | None) -> int:
    """Copies of a flow's frames that crossed its path and were thrown away: what its
    receiver got beyond one copy of each packet (go-back-N's resends of frames that were
    not lost, duplicates). Resends lost on the way took no time at the bottleneck past
    the drop, so they are the timeouts' and NAKs' waits, not wire time. Without the
    receiver's record, every resend."""
    if recv is not None and recv.get("packets") is not None:
        return max(0, recv["packets"] - recv["npackets"])
    return send.get("retransmits") or 0


# -- on a running fabric: each flow's links, the PFC samples, the check of the paths ----
def flow_weights(fab, topo, agents: dict[str, dict]) -> tuple[dict, dict[str, int]]:
    """Each send flow's links (flow_id -> weights) while the fabric still stands: the
    kernel's path for a fixed source port, an even spread otherwise; and how many of
    each."""
    from fabric.paths import PathFinder
    routes = compute_routes(topo)
    finder = PathFinder(fab, topo)
    weights, kinds = {}, {"kernel": 0, "spread": 0}
    try:
        for node, a in agents.items():
            for f in a["flows"]:
                if f["role"] != "send" or not f.get("ifnames"):
                    continue
                first = [topo.peer(node, i) for i in f["ifnames"]]
                if f.get("sport") is not None:
                    hop = first[f["sport"] % len(first)]
                    weights[flow_id(node, f)] = path_weights(
                        finder.path(node, f["dst"], hop, f["sport"]))
                    kinds["kernel"] += 1
                else:
                    weights[flow_id(node, f)] = spread_weights(routes, node, f["dst"], first)
                    kinds["spread"] += 1
    finally:
        finder.close()
    return weights, kinds


def pfc_series(rows: list[dict], t0_s: float, topo) -> dict[Link, list]:
    """The PFC controller's samples per egress link (node, peer): (t_s on the agents'
    clock, lossless backlog bytes, lossless bytes sent, seconds held by pauses so far)."""
    out: dict[Link, list] = defaultdict(list)
    for r in rows:
        out[(r["node"], topo.peer(r["node"], r["ifname"]))].append(
            (t0_s + r["t_s"], r["backlog_bytes"], r["sent_bytes"], r["paused_s"]))
    return dict(out)


def flow_times(rows: dict[str, dict], agents: dict[str, dict]) -> dict[str, float]:
    """Each split flow's completion time, seconds (a nanosecond at least)."""
    return {fid: max(1, f["end_ns"] - f["start_ns"]) / 1e9 for node, a in agents.items()
            for f in a["flows"] if (fid := flow_id(node, f)) in rows}


def summarize(rows: dict[str, dict], agents: dict[str, dict], kinds: dict[str, int],
              check: float | None) -> dict:
    """metrics.json "attribution": the parts' shares of all flows' time, the largest
    unexplained share of any flow's, the share the causes overlapped by, how its paths
    were found and checked."""
    fcts = flow_times(rows, agents)
    total = sum(fcts.values())
    worst = max(rows, key=lambda k: abs(rows[k]["unexplained_s"]) / fcts[k], default=None)
    return {"flows": len(rows), "paths": kinds, "path_check_error": check,
            "share_of_flow_time": {p: sum(r[p] for r in rows.values()) / total
                                   for p in (*PARTS, "unexplained_s")} if total else None,
            "unexplained_max_fraction": abs(rows[worst]["unexplained_s"]) / fcts[worst]
            if worst else None,
            "unexplained_max_flow": worst,
            "overlap_share": sum(r.get("overlap_s", 0.0) for r in rows.values()) / total
            if total else None,
            "waited_s": sum(r["waited_s"] for r in rows.values())}


def explain(rows: dict[str, dict], agents: dict[str, dict], k: int = 5) -> list[str]:
    """One line for each of the `k` slowest flows: its time, part by part."""
    fcts = flow_times(rows, agents)
    names = {"hops_s": "store-and-forward", "paused_s": "paused by PFC",
             "acks_s": "window out, ACKs on the way back",
             "recovery_s": "loss recovery", "cc_s": "held by DCQCN",
             "starved_s": "emulator starved it"}
    lines = []
    for fid in sorted(fcts, key=fcts.get, reverse=True)[:k]:
        r = rows[fid]
        parts = [f"{r['serialization_s']:.3f} s at its fair share "
                 f"({r['fair_mbps']:.2f} Mbit/s, bottleneck {r['bottleneck'] or 'n/a'})"]
        parts += [f"{r[p]:.3f} s {name}" for p, name in names.items() if r[p] >= 0.0005]
        share = r["unexplained_s"] / fcts[fid]
        lines.append(f"`{fid}` {fcts[fid]:.3f} s = " + " + ".join(parts)
                     + f"; unexplained {r['unexplained_s']:+.3f} s ({100 * share:+.1f} %)"
                     + (f"; before it, its sender waited {r['waited_s']:.3f} s for its data"
                        if r["waited_s"] >= 0.0005 else ""))
    return lines


def collect(fab, topo, agents: dict[str, dict]) -> dict:
    """What the split needs from the standing fabric: each flow's links, or why not."""
    sends = sum(1 for a in agents.values() for f in a["flows"] if f["role"] == "send")
    if sends > MAX_FLOWS:
        return {"unavailable": f"{sends} flows: more than {MAX_FLOWS}, the most whose "
                               "fair shares are computed (progressive filling per event)"}
    try:
        weights, kinds = flow_weights(fab, topo, agents)
    except (OSError, KeyError, ValueError) as exc:   # a route the kernel would not give
        return {"unavailable": f"a flow's path could not be read ({exc!r})"}
    return {"weights": weights, "kinds": kinds}


def results(found: dict, topo, agents: dict[str, dict], totals: dict,
            pfc_rows: list[dict] | None, pfc_t0_s: float | None) -> tuple[dict, dict]:
    """(rows by flow_id, metrics.json "attribution") from what `collect` found."""
    if "weights" not in found:
        return {}, {"unavailable": found.get("unavailable", "not collected")}
    capacity = link_capacity(topo)
    lost = lost_fractions(pfc_series(pfc_rows, pfc_t0_s, topo), capacity) \
        if pfc_rows else None
    rows = attribute(agents, found["weights"], capacity, lost)
    summary = summarize(rows, agents, found["kinds"],
                        path_check(agents, found["weights"], topo, totals))
    summary["slowest"] = explain(rows, agents)
    return rows, summary


def summary_lines(att: dict | None) -> list[str]:
    """summary.md's "Why the slowest flows took their time" section."""
    if not att:
        return []
    head = ["", "## Why the slowest flows took their time", ""]
    if "unavailable" in att:
        return head + [f"Not split: {att['unavailable']}."]
    if not att["flows"]:
        return head + ["No send flow finished: nothing to split."]
    share = att["share_of_flow_time"] or {}
    check = att["path_check_error"]
    out = head + [
        f"Each send flow's time split (flows.csv, plots/flow_time_split.png; docs/fidelity.md"
        f" says how): paths of {att['paths']['kernel']} flows from the kernel's route "
        f"lookups, {att['paths']['spread']} spread evenly"
        + (f"; bytes they put on the switch links are {100 * check:.1f} % off the counters'"
           if check is not None else "") + ".",
        "Of all flows' time: " + ", ".join(f"{p.removesuffix('_s')} {100 * v:.1f} %"
                                            for p, v in share.items()) + "."
        + (f" Causes overlapped by {100 * att['overlap_share']:.1f} % of it (a wait while "
           "frames were on the wire, a pause in a recovery): counted once, in the order "
           "paused, starved, resent, timeouts, cc, acks." if att.get("overlap_share")
           else ""),
        f"Largest unexplained share of one flow's time: "
        f"{100 * (att['unexplained_max_fraction'] or 0):.1f} % "
        f"(`{att['unexplained_max_flow']}`). Between their flows, senders waited "
        f"{att.get('waited_s', 0.0):.3f} s in all with nothing to send (their data not "
        "ready: a collective's earlier steps), which is no flow's time.", ""]
    return out + [f"- {line}" for line in att["slowest"]]
