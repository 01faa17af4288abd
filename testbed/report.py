"""Human-readable summaries of a fabric (what was built, at which rates, how fast)."""

from __future__ import annotations

from topologies import units


def _real_rate(rate_mbps: float, factor: float) -> str:
    return units.rate_text(units.real_mbps(rate_mbps, factor))


def fabric_summary(fabric) -> str:
    topo = fabric.topo
    s = topo.summary()
    roles = ", ".join(f"{n} {r}" for r, n in sorted(s["roles"].items()))
    rates = sorted({d["rate_mbps"] for _, _, d in topo.graph.edges(data=True)})
    eps = topo.endpoints()
    a, b = eps[0], eps[-1]
    seed_note = (f"fib_multipath_hash_seed={fabric.seed}" if fabric.seed_supported
                 else "kernel has no fib_multipath_hash_seed: ECMP hash is per-boot random")
    lines = [
        f"# fabric {topo.name} ({topo.kind})",
        f"nodes: {s['nodes']} ({roles}); links: {s['links']}; "
        f"techs: {', '.join(f'{n} {t}' for t, n in sorted(s['link_techs'].items()))}",
        "link rates: " + ", ".join(
            f"{r:g} Mbit/s (= {_real_rate(r, topo.scale_factor)} real)" for r in rates)
        + f"; scale factor x{topo.scale_factor:g}",
        f"addresses: links 198.18.0.0/16 (/31 each), loopbacks 198.19.0.0/16; "
        f"ECMP: L4 hash (fib_multipath_hash_policy=1), {seed_note}",
        "build: " + ", ".join(f"{k} {v:.2f} s" for k, v in fabric.timings.items())
        + f" (total {sum(fabric.timings.values()):.2f} s)",
        f"try: sudo ip netns exec {fabric.ns(a)} ping -c 3 {fabric.plan.loopback[b]}"
        f"   # {a} -> {b}",
    ]
    return "\n".join(lines)
