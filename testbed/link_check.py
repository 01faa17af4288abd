"""The bytes a run's flows put on each link, from their paths, against the links'
counters: the check that the paths the time split (testbed.attribution) uses are the
paths the frames took."""

from __future__ import annotations

from collections import defaultdict

from traffic.agent_config import FRAME_OVERHEAD_BYTES

Link = tuple[str, str]


def flow_id(node: str, f: dict) -> str:
    return f"{node}:{f['tag']}#{f['iteration']}"


def frame_bytes(f: dict) -> float:
    """A flow's mean frame on the wire: its payload per packet and the headers."""
    return f["size_bytes"] / max(1, f["npackets"]) + FRAME_OVERHEAD_BYTES


def path_check(agents: dict[str, dict], weights: dict, topo, totals: dict) -> float | None:
    """How far the bytes the paths put on each switch-to-switch link are from the bytes
    its counters measured: sum |predicted - measured| / sum measured (ACKs, which are
    not predicted, add a little). The counters count what a port sent, so a frame
    dropped at a switch port's queue (its `drops`) or before it is not predicted there:
    carried_frames follows each flow's frames hop by hop, less their share of each
    switch port's drops. A sender's `packets` are what its own port sent already (its
    port's drops are frames the agent's kernel refused, never counted as sent)."""
    forwards = {n for n in topo.graph if topo.graph.nodes[n].get("forwards")}
    drops = {(node, topo.peer(node, ifname)): t.get("drops", 0)
             for (node, ifname), t in totals.items() if node in forwards}
    sends = {flow_id(node, f): (node, f) for node, a in agents.items() for f in a["flows"]
             if f["role"] == "send" and flow_id(node, f) in weights}
    carried = carried_frames({fid: (node, f["packets"]) for fid, (node, f) in sends.items()},
                             {fid: weights[fid] for fid in sends}, drops)
    predicted: dict[Link, float] = defaultdict(float)
    for fid, (_, f) in sends.items():
        for link, frames in carried[fid].items():
            predicted[link] += frames * frame_bytes(f)
    measured = {}
    for (node, ifname), t in totals.items():
        peer = topo.peer(node, ifname)
        if node in forwards and peer in forwards:
            measured[(node, peer)] = t["tx_bytes"]
    total = sum(measured.values())
    if not total:
        return None
    return sum(abs(predicted.get(k, 0.0) - v) for k, v in measured.items()) / total


def carried_frames(sent: dict[str, tuple[str, int]], weights: dict[str, dict[Link, float]],
                   drops: dict[Link, int]) -> dict[str, dict[Link, float]]:
    """The frames each flow put through each of its links (a port's counters count them):
    the frames it sent (`sent`: flow -> (source, frames)) spread by its `weights`, each
    link taking them in hop order from the source, less the link's `drops` shared among
    the flows offering frames to it in proportion to what each offered."""
    depth: dict[str, dict[str, int]] = {}
    for fid, (src, _) in sent.items():
        d = {src: 0}
        links = list(weights[fid])
        for _ in links:                       # longest-path relaxation, at most len() rounds
            for a, b in links:
                if a in d and d.get(b, -1) < d[a] + 1:
                    d[b] = d[a] + 1
        depth[fid] = d
    reach = {fid: {src: float(n)} for fid, (src, n) in sent.items()}  # frames at each node
    out: dict[str, dict[Link, float]] = {fid: {} for fid in sent}
    deepest = max((max(d.values()) for d in depth.values()), default=0)
    for level in range(deepest):
        offered: dict[str, dict[Link, float]] = defaultdict(dict)
        per_link: dict[Link, float] = defaultdict(float)
        for fid, w in weights.items():
            if fid not in sent:
                continue
            for (a, b), share in w.items():
                if depth[fid].get(a) != level:
                    continue
                out_of_a = sum(v for (x, _), v in w.items() if x == a)
                frames = reach[fid].get(a, 0.0) * share / out_of_a if out_of_a else 0.0
                offered[fid][(a, b)] = frames
                per_link[(a, b)] += frames
        for fid, links in offered.items():
            for link, frames in links.items():
                kept = 1 - min(1.0, drops.get(link, 0) / per_link[link]) \
                    if per_link[link] else 1.0
                out[fid][link] = frames * kept
                reach[fid][link[1]] = reach[fid].get(link[1], 0.0) + frames * kept
    return out
