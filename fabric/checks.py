"""Fabric checks on real packets: every endpoint reaches every other, paths are what the
topology promises, and ECMP spreads different UDP source ports over the spines.

Used by `testbed deploy --check` and the demo; the tests assert the same properties
one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric.probe import ping_all, trace
from topologies.spec import Topology

ECMP_SPORTS = range(40000, 40032)


@dataclass
class PathCheck:
    src: str
    dst: str
    what: str           # what the topology promises, in words
    ok: object          # callable(path) -> bool


def _between(topo: Topology, path: list) -> list[str]:
    """Roles of the nodes strictly between source and destination."""
    return [topo.role(n) if n else "?" for n in path[1:-1]]


def expected_paths(topo: Topology) -> list[PathCheck]:
    """A few (src, dst) pairs per topology kind with the path property they must have."""
    g, kind = topo.graph, topo.kind
    eps = topo.endpoints()
    checks: list[PathCheck] = []
    if kind in ("rail_optimized", "rail_only"):
        servers = sorted({g.nodes[e]["server"] for e in eps})
        rails = sorted({g.nodes[e]["rail"] for e in eps})
        gpu = {(g.nodes[e]["server"], g.nodes[e]["rail"]): e for e in eps}
        # a rail can span leaves (rail_optimized leaves_per_rail): one hop within a leaf
        leaf = {s: next(p for p in g.adj[gpu[s, 0]] if g.nodes[p]["role"] == "leaf")
                for s in servers}
        same_leaf = [s for s in servers if leaf[s] == leaf[0]]
        if len(same_leaf) > 1:
            checks.append(PathCheck(gpu[0, 0], gpu[same_leaf[-1], 0], "same rail: one leaf hop",
                                    lambda p: _between(topo, p) == ["leaf"]))
        if len(rails) > 1:
            a, b = gpu[0, 0], gpu[0, rails[-1]]
            checks.append(PathCheck(a, b, "same server: through the NVLink domain only",
                                    lambda p: _between(topo, p) == ["nvswitch"]))
        if len(servers) > 1 and len(rails) > 1:
            a, b = gpu[0, 0], gpu[servers[-1], rails[-1]]
            if kind == "rail_optimized":
                checks.append(PathCheck(a, b, "cross rail: leaf, spine, leaf",
                                        lambda p: _between(topo, p) == ["leaf", "spine", "leaf"]))
            else:
                mid = gpu[0, rails[-1]]
                checks.append(PathCheck(
                    a, b, f"cross rail (PXN): NVLink to {mid}, then its rail; no spine",
                    lambda p, mid=mid: p[1:-1] == [f"nvs{0}", mid, f"leaf{rails[-1]}"]))
    elif kind == "one_tier":
        checks.append(PathCheck(eps[0], eps[-1], "one switch hop (a plane)",
                                lambda p: _between(topo, p) == ["plane"]))
    elif kind == "full_mesh":
        checks.append(PathCheck(eps[0], eps[-1], "direct, no switch",
                                lambda p: _between(topo, p) == []))
    elif kind == "leaf_spine":
        checks.append(PathCheck(eps[0], eps[-1], "cross leaf: leaf, spine, leaf",
                                lambda p: _between(topo, p) == ["leaf", "spine", "leaf"]))
    return checks


def ecmp_spread(fabric, src: str, dst: str, sports=ECMP_SPORTS) -> dict[str, int]:
    """How many of the traced source ports crossed each spine (or plane) on src -> dst."""
    counts: dict[str, int] = {}
    for sport in sports:
        for node in trace(fabric, src, dst, sport=sport)[1:-1]:
            if node and fabric.topo.role(node) in ("spine", "plane"):
                counts[node] = counts.get(node, 0) + 1
    return counts


def check_fabric(fabric, progress=None) -> tuple[bool, str]:
    """Run the checks; return (all passed, a printable report)."""
    progress = progress or (lambda msg: None)
    topo = fabric.topo
    lines, ok = ["# fabric check (real packets)"], True
    progress("check: pinging every endpoint pair")
    reach = ping_all(fabric, topo.endpoints())
    failed = [pair for pair, good in reach.items() if not good]
    ok &= not failed
    lines.append(f"reachability: {len(reach) - len(failed)}/{len(reach)} endpoint pairs answer"
                 + (f"; FAILED: {failed[:5]}" if failed else ""))
    progress("check: tracing paths")
    for check in expected_paths(topo):
        path = trace(fabric, check.src, check.dst)
        good = bool(check.ok(path))
        ok &= good
        lines.append(f"path {check.src} -> {check.dst}: {' > '.join(map(str, path))}  "
                     f"[{check.what}: {'ok' if good else 'FAILED'}]")
    spines = topo.nodes_with_role("spine") or topo.nodes_with_role("plane")
    if len(spines) > 1:
        far = [c for c in expected_paths(topo) if "spine" in c.what or "plane" in c.what]
        if far:
            src, dst = far[0].src, far[0].dst
            spread = ecmp_spread(fabric, src, dst)
            used = len(spread)
            ok &= used > 1
            lines.append(f"ECMP {src} -> {dst}: {len(ECMP_SPORTS)} UDP source ports took "
                         + ", ".join(f"{s} x{n}" for s, n in sorted(spread.items()))
                         + f"  [{used}/{len(spines)} used: {'ok' if used > 1 else 'FAILED'}]")
    lines.append("result: " + ("all checks passed" if ok else "SOME CHECKS FAILED"))
    return ok, "\n".join(lines)
