"""Inspect the deployed fabric: what the kernel holds, read back through pyroute2."""

from __future__ import annotations

import ipaddress

from pyroute2 import IPRoute

from fabric import netns
from fabric.addressing import plan as address_plan
from fabric.shaping import configured_rate_mbps, queue_stats
from fabric.state import read_state
from topologies.spec import SpecError, Topology, did_you_mean


def _routes(ipr, owner) -> list[dict]:
    out = []
    for r in ipr.get_routes(family=2, table=254):
        if r.get_attr("RTA_GATEWAY") is None and r.get_attr("RTA_MULTIPATH") is None:
            continue  # connected /31s: already shown as ports
        dst = f"{r.get_attr('RTA_DST') or '0.0.0.0'}/{r['dst_len']}"
        gws = [r.get_attr("RTA_GATEWAY")] if r.get_attr("RTA_GATEWAY") else [
            nh.get_attr("RTA_GATEWAY") for nh in r.get_attr("RTA_MULTIPATH")]
        out.append({"dst": dst, "via": [owner(g) for g in gws], "gateways": gws})
    return out


def inspect_deployed(routes: bool = False, node: str | None = None) -> dict | None:
    state = read_state()
    if state is None:
        return None
    topo = Topology.from_data(state["topology"])
    plan = address_plan(topo)
    names = [node] if node else list(topo.graph.nodes)
    data = {"topology": topo.summary(), "seed": state["seed"],
            "created_utc": state["created_utc"], "nodes": []}
    if node is not None and node not in topo.graph:
        known = sorted(topo.graph.nodes)
        shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
        raise SpecError("node", f"{node!r} is not a node of the deployed {topo.name}"
                        f"{did_you_mean(node, known)} ({len(known)} nodes: {shown})")
    for name in names:
        ns = netns.name_of(name, state.get("lab", ""))
        entry = {"name": name, "role": topo.role(name), "netns": ns,
                 "loopback": plan.loopback[name], "ports": []}
        with netns.entered(ns):
            ipr = IPRoute()
        with ipr:
            links = {lk.get_attr("IFLA_IFNAME"): lk for lk in ipr.get_links()}
            for port in plan.ports[name]:
                link = links[port.ifname]
                edge = topo.graph.edges[name, port.peer]
                q = queue_stats(ipr, link["index"])
                entry["ports"].append({
                    "ifname": port.ifname, "address": f"{port.address}/31",
                    "peer": port.peer, "peer_ifname": port.peer_ifname,
                    "state": link.get_attr("IFLA_OPERSTATE"), "mtu": link.get_attr("IFLA_MTU"),
                    "rate_mbps": round(configured_rate_mbps(ipr, link["index"]), 3),
                    "tech": edge["tech"], "length_m": edge["length_m"],
                    "queue_bytes": edge["queue_bytes"], "tx_bytes": q["sent_bytes"],
                    "drops": q["drops"]})
            if routes:
                entry["routes"] = _routes(ipr, plan.owner)
        data["nodes"].append(entry)
    return data


def format_inspect(data: dict) -> str:
    t = data["topology"]
    lines = [f"# {t['name']} ({t['kind']}): {t['nodes']} nodes, {t['links']} links, "
             f"deployed {data['created_utc']}, seed {data['seed']}", "",
             f"{'NODE':10s} {'ROLE':9s} {'NETNS':14s} {'LOOPBACK':14s} PORTS"]
    for n in data["nodes"]:
        lines.append(f"{n['name']:10s} {n['role']:9s} {n['netns']:14s} {n['loopback']:14s} "
                     f"{len(n['ports'])}")
    lines += ["", f"{'PORT':15s} {'ADDRESS':17s} {'PEER':15s} {'STATE':6s} {'MTU':>5s} "
              f"{'RATE Mbit/s':>11s} {'TECH':8s} {'LEN m':>6s} {'TX bytes':>10s} {'DROPS':>6s}"]
    for n in data["nodes"]:
        for p in n["ports"]:
            lines.append(f"{p['ifname']:15s} {p['address']:17s} {p['peer_ifname']:15s} "
                         f"{p['state']:6s} {p['mtu']:5d} {p['rate_mbps']:11g} {p['tech']:8s} "
                         f"{p['length_m']:6g} {p['tx_bytes']:10d} {p['drops']:6d}")
    for n in data["nodes"]:
        if "routes" not in n:
            continue
        lines += ["", f"routes of {n['name']}:"]
        for r in sorted(n["routes"], key=lambda r: ipaddress.ip_network(r["dst"])):
            lines.append(f"  {r['dst']:18s} via {', '.join(map(str, r['via']))}")
    return "\n".join(lines)


def dev_counters(text: bytes) -> dict[str, list[int]]:
    """ifname -> the 16 counters of its /proc/net/dev line (rx bytes, packets, errs,
    drop, fifo, frame, compressed, multicast; tx bytes, packets, errs, drop, ...)."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(b":")
        out[name.strip().decode()] = [int(x) for x in rest.split()]
    return out
