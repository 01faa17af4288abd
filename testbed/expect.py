"""What physics or the literature predicts, beside what a script measured.

Every experiment script ends its summary with a table of `Expectation`s: the quantity,
the formula in one line, its source, the predicted value (or range), the measured one,
and "matches" or why not. A number with nothing to compare it to convinces nobody.

    e = Expectation("RoCE JCT at 2 % loss", "JCT(0) x (1 + (W-1) P) / (1 - P)",
                    GBN_SOURCE, low=0.05, high=0.30, measured=0.18, unit="s")
    e.verdict()            # "matches"
    expectation_lines([e]) # markdown section for summary.md
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from topologies import units
from traffic.workloads import chunks

TOLERANCE = 0.10    # a measurement this close (relative) to the prediction matches it

GBN_SOURCE = "Bertsekas & Gallager, Data Networks (2nd ed. 1992), sec. 2.4 (ARQ efficiency)"
RING_SOURCE = "Patarasuk & Yuan, J. Parallel Distrib. Comput. 69(2), 2009 (ring all-reduce)"


@dataclass
class Expectation:
    """A prediction [low, high] (low == high for a point) and what was measured."""

    what: str
    formula: str
    source: str
    low: float
    high: float
    measured: float
    unit: str = ""
    tolerance: float = TOLERANCE
    why_not: str = ""        # the known reason, printed when it does not match

    def matches(self) -> bool:
        return (self.low * (1 - self.tolerance) <= self.measured
                <= self.high * (1 + self.tolerance))

    def verdict(self) -> str:
        if self.matches():
            return "matches"
        side = "above" if self.measured > self.high else "below"
        return f"does not match ({side})" + (f": {self.why_not}" if self.why_not else "")

    def predicted(self) -> str:
        if self.low == self.high:
            return f"{self.low:.4g}"
        return f"{self.low:.4g} to {self.high:.4g}"

    def to_dict(self) -> dict:
        return {**asdict(self), "matches": self.matches(), "verdict": self.verdict()}

    @classmethod
    def from_dict(cls, data: dict) -> Expectation:
        """The row `to_dict` wrote (metrics.json), its verdict recomputed."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def ring_allreduce(what: str, ideal_s: float, measured_s: float, why_not: str = "",
                   formula: str = "2(n-1)/n x S/B") -> Expectation:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the message S at its link
    rate B (`ideal_s`, computed by the run from the topology)."""
    return Expectation(what, formula, RING_SOURCE, ideal_s, ideal_s, measured_s, "s",
                       why_not=why_not)


def ring_floor_s(n: int, message_bytes: int, link_mbps: float, payload_bytes: int,
                 switch_hops: float = 1) -> float:
    """The least time a ring all-reduce can take on any network: 2(n-1) steps in turn,
    each its chunk with every packet's headers at the link rate B, plus the
    store-and-forward of its last frame at each of `switch_hops` switches (a step starts
    only once the previous one's chunk has wholly arrived). The alpha-beta model
    (RING_SOURCE) with alpha = switch_hops x frame / B, no propagation, no software:

        2(n-1) x [ (S/n + ceil(S/n / MTU) x H) / B + hops x (MTU + H) / B ]

    At 100 Mbit/s, 4 KiB packets, one switch and 2 MiB per rank this is 1.030x the ideal
    2(n-1)/n x S/B at 8 ranks, 1.046 at 16, 1.078 at 32 and 1.141 at 64: no network
    reaches that ideal, and the smaller the chunk the further it is. On a fabric whose
    switches feed links of other rates, `switch_hops` is ring_path's frame times."""
    from testbed.rate import frame_bits
    rate = units.mbps_to_bytes_per_s(link_mbps)
    frame = frame_bits(payload_bytes) // 8
    header = frame - payload_bytes
    total = 0.0
    for chunk in chunks(message_bytes, n):   # the ring's own split (traffic.workloads)
        packets = -(-chunk // payload_bytes)
        total += (chunk + packets * header + switch_hops * frame) / rate
    return 2 * (n - 1) / n * total       # every chunk crosses each link 2(n-1)/n times


def ring_path(topo, ranks: list[str]) -> tuple[float, float]:
    """A ring over `ranks` on `topo`: the rate every step runs at (its slowest flow's
    bottleneck, Mbit/s) and the most store-and-forward any of its flows pays, in frame
    times at that rate: each switch on a flow's path holds a frame for its wire time on
    the link it leaves by (a switch feeding a link 4x faster costs a quarter). One
    switch between links of one rate is 1.0, ring_floor_s's `switch_hops`."""
    from itertools import pairwise

    from fabric.routing import compute_routes, path
    g = topo.graph
    routes = compute_routes(topo)       # the fabric's own: endpoints are never transit
    paths = [path(topo, routes, a, b) for a, b in zip(ranks, ranks[1:] + ranks[:1],
                                                      strict=True)]
    rate = min(g.edges[a, b]["rate_mbps"] for p in paths for a, b in pairwise(p))
    frames = max(sum(rate / g.edges[p[k], p[k + 1]]["rate_mbps"]
                     for k in range(1, len(p) - 1)) for p in paths)
    return rate, frames


def expectation_lines(expectations: list[Expectation]) -> list[str]:
    """The "expected vs measured" section of a summary (markdown)."""
    lines = ["", "## Expected vs measured", "",
             f"A measurement within {TOLERANCE:.0%} of the prediction (or its range) matches, "
             "unless the row says otherwise (published ranges: as published).",
             "", "| quantity | formula | source | predicted | measured | verdict |",
             "|---|---|---|---|---|---|"]
    for e in expectations:
        unit = f" {e.unit}" if e.unit else ""
        lines.append(f"| {e.what} | {e.formula} | {e.source} | {e.predicted()}{unit} | "
                     f"{e.measured:.4g}{unit} | {e.verdict()} |")
    return lines
