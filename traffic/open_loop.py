"""Open-loop flows (workload flows): each sending host starts flows at Poisson instants,
sizes drawn from a flow-size distribution (traffic.flow_sizes), so that its link carries
a target load; optionally beside a background job of elephants (mice among elephants).

    [flows] table ─▶ FlowSettings ─▶ open_loop_schedule(ranks, host link rates) ─▶
      per host: step k computes gap_k, then starts flow k (after step k-1): the gaps run
      one after another on the host's compute stream (traffic.flows), so the flows start
      at the Poisson instants whatever the earlier ones are doing; every received flow is
      its own step, waiting for nothing ─▶ the agents run the steps as a graph

A host of link rate B at load rho starts flows at rate lambda = rho B / E[S]: its gaps
are exponential with mean E[S] / (rho B). The flows are drawn as one merged Poisson
process over the sending hosts (each arrival a host in proportion to its lambda), then
each host's in time order; `count` flows in all. Destinations: uniform over the other
ranks, a fixed seeded derangement (each host always to the same peer), or the given
pairs (a host sends to its listed peers in turn). Pure data: the agents never see the
settings, only the steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from topologies import units
from topologies.settings import setting
from topologies.spec import SpecError
from traffic.flow_sizes import FlowSizes
from traffic.flow_sizes import load as load_sizes
from traffic.workloads import Schedule, Step, Transfer, build_schedule

DESTINATIONS = ("uniform", "permutation", "pairs")
BACKGROUNDS = ("none", "elephants", "allreduce")
MAX_FLOWS = 20_000          # per iteration: each is a step and a results row
TAG = "flows"               # the open-loop flows' tags: flows.f<k>.<src>><dst>
BACKGROUND_TAG = "bg"       # the background job's: bg.<its own tag>


@dataclass
class FlowSettings:
    """Open-loop flows: Poisson arrivals at a load, sizes from a distribution (workload
    flows; the [flows] table, docs/flows.md)"""

    flow_sizes: str = setting(
        "websearch", "flow sizes: a shipped distribution (websearch, fb_hadoop, ali_storage, "
        "google_rpc) or a CDF file in ns-3 HPCC's format (docs/flows.md)", metavar="NAME|FILE")
    flow_load: float = setting(0.3, "each sending host's offered load, a fraction of its "
                               "link's rate", number=True, low=0, low_open=True, high=0.95)
    flow_count: int = setting(100, "flows in each iteration, over all sending hosts",
                              whole=True, low=1, high=MAX_FLOWS, metavar="N")
    flow_duration_s: float = setting(
        0.0, "instead of flow_count: every flow that arrives within this many seconds "
        "(emulated time) of the iteration's start (0: flow_count flows)", number=True,
        low=0, metavar="S")
    flow_destinations: str = setting(
        "uniform", "each flow's receiver: uniform over the other ranks, permutation (a "
        "seeded derangement: each host one peer), or pairs (the experiment's pairs)",
        choices=DESTINATIONS)
    flow_background: str = setting(
        "none", "a job beside the flows, reported apart: elephants (each rank "
        "message_bytes to its permutation peer, from the start) or allreduce (a ring of "
        "message_bytes over the ranks)", choices=BACKGROUNDS)

    def check_flows(self, pairs: list[str]) -> FlowSizes:
        """The distribution, or SpecError naming the setting."""
        if self.flow_destinations == "pairs" and not pairs:
            raise SpecError("flows.flow_destinations", 'pairs needs the experiment\'s pairs '
                            '(e.g. pairs = ["l0h0>l1h0"]), or use uniform or permutation')
        return load_sizes(self.flow_sizes, "flows.flow_sizes")


@dataclass(frozen=True)
class PlannedFlow:
    """One open-loop flow as asked: when (ns after the workload's start), who, how much."""

    tag: str
    src: str
    dst: str
    size_bytes: int
    arrival_ns: int


def _derangement(ranks: list[str], rng: random.Random) -> dict[str, str]:
    while True:
        perm = ranks[:]
        rng.shuffle(perm)
        if all(a != b for a, b in zip(ranks, perm, strict=True)):
            return dict(zip(ranks, perm, strict=True))


def plan_flows(ranks: list[str], sizes: FlowSizes, load: float, count: int,
               destinations: str, pairs: list[tuple[str, str]] | None, seed: int,
               host_mbps: dict[str, float], duration_s: float = 0.0) -> list[PlannedFlow]:
    """`count` flows in arrival order (with `duration_s`: those arriving within it), a
    merged Poisson process over the sending hosts, each at lambda = load B / E[S] (B its
    link's rate); SpecError for a duration that holds more than MAX_FLOWS."""
    rng = random.Random(seed)
    senders = sorted({a for a, _ in pairs}, key=ranks.index) if destinations == "pairs" \
        else list(ranks)
    peers = ({s: [b for a, b in pairs if a == s] for s in senders} if destinations == "pairs"
             else None)
    perm = _derangement(list(ranks), rng) if destinations == "permutation" else None
    mean = sizes.mean_bytes()
    lam = {h: load * units.mbps_to_bytes_per_s(host_mbps[h]) / mean for h in senders}
    total = sum(lam.values())
    t = 0.0
    turns = dict.fromkeys(senders, 0)
    if duration_s and total * duration_s > MAX_FLOWS:
        raise SpecError("flows.flow_duration_s", f"{duration_s:g} s at {total:.0f} flows/s "
                        f"is about {total * duration_s:.0f} flows, more than {MAX_FLOWS}: "
                        "a shorter duration or a lower flow_load")
    out = []
    for k in range(MAX_FLOWS if duration_s else count):
        t += rng.expovariate(total)
        if duration_s and t > duration_s:
            break
        src = rng.choices(senders, weights=[lam[h] for h in senders])[0]
        if destinations == "uniform":
            dst = rng.choice([r for r in ranks if r != src])
        elif perm is not None:
            dst = perm[src]
        else:
            dst = peers[src][turns[src] % len(peers[src])]
            turns[src] += 1
        out.append(PlannedFlow(f"{TAG}.f{k}.{src}>{dst}", src, dst, sizes.sample(rng),
                               round(t * 1e9)))
    return out


def _append(sched: Schedule, other: Schedule) -> None:
    """`other`'s steps after each rank's own, each waiting for what it waited for there
    (its previous step unless it says), so the two run side by side."""
    for rank, steps in other.items():
        mine = sched.setdefault(rank, [])
        base = len(mine)
        for j, st in enumerate(steps):
            after = st.after if st.after is not None else ((j - 1,) if j else ())
            mine.append(Step(st.sends, st.recvs, tuple(base + d for d in after),
                             st.compute_ns, st.label or BACKGROUND_TAG, st.op))


def background(kind: str, ranks: list[str], message_bytes: int, seed: int) -> Schedule:
    """The background job's steps, tagged bg.<tag>: none, elephants (a permutation of
    message_bytes each) or a ring all-reduce of message_bytes."""
    if kind == "none":
        return {}
    workload = "permutation" if kind == "elephants" else kind
    return build_schedule(workload, ranks, message_bytes, seed)


def retagged(sched: Schedule, prefix: str) -> Schedule:
    """`sched` with every transfer's tag under `prefix`."""
    def t(x: Transfer) -> Transfer:
        return Transfer(x.src, x.dst, x.size_bytes, f"{prefix}.{x.tag}")
    return {r: [Step([t(x) for x in st.sends], [t(x) for x in st.recvs], st.after,
                     st.compute_ns, st.label, st.op) for st in steps]
            for r, steps in sched.items()}


def open_loop_schedule(flows: list[PlannedFlow], ranks: list[str],
                       extra: Schedule | None = None) -> Schedule:
    """Each sender's chain of gap-then-flow steps, each receiver's steps, then `extra`'s
    (a background job, tagged bg.) beside them."""
    sched: Schedule = {r: [] for r in ranks}
    last: dict[str, tuple[int, int]] = {}       # sender -> (its chain's last step, arrival)
    for f in flows:
        t = Transfer(f.src, f.dst, f.size_bytes, f.tag)
        steps = sched[f.src]
        prev, since = last.get(f.src, (None, 0))
        # a gap of 0 would make a step with no computation: it must still wait its turn
        steps.append(Step(sends=[t], after=(prev,) if prev is not None else (),
                          compute_ns=max(1, f.arrival_ns - since), label=TAG))
        last[f.src] = (len(steps) - 1, f.arrival_ns)
        sched[f.dst].append(Step(recvs=[t], after=(), label=TAG))
    if extra:
        _append(sched, retagged(extra, BACKGROUND_TAG))
    return {r: s for r, s in sched.items() if s}
